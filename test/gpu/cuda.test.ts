/**
 * The `gpu` tier: bench/gpu/checks.ts on a CUDA device, one test per check. Skipped (as a whole)
 * when the addon sees no CUDA device, so the normal suite passes on CPU machines; on a GPU box
 * with the dev set-up, `npx jest test/gpu` runs it. A bare GPU machine (no jest) runs the same
 * checks with scripts/gpu/run.sh. A check that skips for a missing tool (transformers, the
 * Temporal CLI) fails here: on a GPU box the tier is meant to run in full.
 */
import * as fs from 'node:fs';
import * as native from '../../native';
import type { CheckContext } from '../../bench/gpu/check';
import { CHECKS, makeWorkDir } from '../../bench/gpu/checks';

const cuda = native.info().cuda;

(cuda ? describe : describe.skip)('gpu tier (CUDA)', () => {
  let ctx: CheckContext;
  beforeAll(() => {
    ctx = {
      device: process.env.PRIME_GPU_DEVICE || 'cuda',
      workDir: makeWorkDir(),
      python: process.env.PRIME_PYTHON || 'python3',
    };
  });
  afterAll(() => fs.rmSync(ctx.workDir, { recursive: true, force: true }));

  test.each(CHECKS.map((c) => [c.name, c] as const))(
    '%s',
    async (_name, check) => {
      const result = await check.run(ctx);
      expect(`${result.status}: ${result.detail}`).toMatch(/^pass: /);
    },
    10 * 60_000,
  );
});
