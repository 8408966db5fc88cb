/**
 * The GPU plan's dry run (bench/gpu/plan.ts --device cpu, issue #52): both commands' steps, in
 * order, on the CPU with tiny shapes, as the compiled script a card runs (dist/, which set-up
 * builds): every step that applies to the CPU passes and leaves its result in the output folder,
 * the paged kernel's benchmark is skipped as CUDA's, and a deadline that has passed skips the
 * steps it leaves no time, recording why. So the plan cannot rot between card sessions.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { projectRoot } from '../lib/paths';

const PLAN = path.join(projectRoot, 'dist', 'bench', 'gpu', 'plan.js');

interface Outcome {
  step: string;
  part: number;
  status: string;
  detail: string;
}

function runPlan(args: string[]): { code: number | null; out: string; outcomes: Outcome[]; dir: string } {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-gpu-plan-'));
  const r = spawnSync(process.execPath, [PLAN, '--device', 'cpu', '--out', dir, ...args], {
    cwd: projectRoot,
    encoding: 'utf8',
    timeout: 8 * 60_000,
  });
  const file = path.join(dir, 'plan.json');
  const outcomes = fs.existsSync(file)
    ? (JSON.parse(fs.readFileSync(file, 'utf8')) as { outcomes: Outcome[] }).outcomes
    : [];
  return { code: r.status, out: `${r.stdout}\n${r.stderr}`, outcomes, dir };
}

test(
  'both parts run on the CPU: every step passes and leaves its result, the paged kernel skipped as CUDA code',
  () => {
    const { code, out, outcomes, dir } = runPlan(['--part', 'all']);
    expect({ code, out: code === 0 ? '' : out }).toEqual({ code: 0, out: '' });
    expect(outcomes.map((o) => `${o.part} ${o.step}: ${o.status}`)).toEqual([
      '1 kernels: pass',
      '1 decode: pass',
      '1 decode-paged: skip',
      '1 train: pass',
      '1 train-fused: pass',
      '1 nccl: pass',
      '2 rl-size: pass',
      '2 train-1.7b: pass',
      '2 train-1.7b-fused: pass',
      '2 serving: pass',
      '2 two-ranks: pass',
    ]);
    expect(outcomes.find((o) => o.step === 'decode-paged')!.detail).toBe('the paged decode kernel is CUDA code');
    for (const o of outcomes.filter((x) => x.status === 'pass'))
      expect({ step: o.step, bytes: fs.statSync(path.join(dir, `${o.step}.md`)).size > 0 }).toEqual({
        step: o.step,
        bytes: true,
      });
    // The checks' own table: the fused kernels pass on their CPU formulas, the paged kernel's skip.
    const kernels = JSON.parse(fs.readFileSync(path.join(dir, 'kernels.json'), 'utf8')) as {
      rows: Array<{ check: string; status: string }>;
    };
    expect(new Set(kernels.rows.filter((r) => r.check.startsWith('fused ')).map((r) => r.status))).toEqual(
      new Set(['pass']),
    );
    expect(new Set(kernels.rows.filter((r) => r.check.startsWith('paged ')).map((r) => r.status))).toEqual(
      new Set(['skip']),
    );
    // The training table: rows without and with the fused kernels under one header.
    expect(fs.readFileSync(path.join(dir, 'train.md'), 'utf8')).toMatch(
      /\| model \| fused kernels \|.*\n.*\n\| tiny .* \| off \|/,
    );
    expect(fs.readFileSync(path.join(dir, 'plan.md'), 'utf8')).toMatch(/^GPU plan, part all, on cpu/);
    fs.rmSync(dir, { recursive: true, force: true });
  },
  10 * 60_000,
);

test('a command whose time is spent skips the steps it cannot start, saying so in plan.md', () => {
  const { code, outcomes, dir } = runPlan(['--part', '1', '--seconds', '1']);
  expect(code).toBe(0);
  expect(outcomes.map((o) => o.step)).toEqual(['kernels', 'decode', 'decode-paged', 'train', 'train-fused', 'nccl']);
  for (const o of outcomes.filter((x) => x.step !== 'decode-paged'))
    expect(`${o.step}: ${o.status} ${o.detail}`).toMatch(
      /: skip (the command's time is spent|the kernels step did not run)/,
    );
  expect(fs.readFileSync(path.join(dir, 'plan.md'), 'utf8')).toMatch(/\| 1 \| kernels \| .* \| skip \|/);
  fs.rmSync(dir, { recursive: true, force: true });
});

test('bad arguments are refused by name (exit 2)', () => {
  const r = spawnSync(process.execPath, [PLAN, '--part', '3'], { cwd: projectRoot, encoding: 'utf8' });
  expect([r.status, r.stderr.trim()]).toEqual([2, "gpu-plan: --part must be 1, 2 or all, not '3'"]);
  const s = spawnSync(process.execPath, [PLAN, '--only', 'nope'], { cwd: projectRoot, encoding: 'utf8' });
  expect(s.status).toBe(2);
  expect(s.stderr).toMatch(/--only: no step 'nope' \(steps: kernels, decode, /);
});
