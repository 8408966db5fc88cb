/**
 * The engine's own CPU loops (native/src/cpu_kernels.h), each instruction set's copy this CPU runs
 * (the baseline x86-64 always; AVX2, AVX-512 where present), against fp64; and the paths that use
 * them in a model: decode steps (the in-place GEMM, paged attention with vectorised head sizes) and
 * bf16 inference on the CPU against the fp32 forward.
 */
import * as fs from 'node:fs';
import { info, setThreads, type NativeModel } from '../native';
import { cpuKernelCheck } from '../native/checks';
import { loadModel } from '../lib/model/engine';
import { greedyDecode, packRow, randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';

setThreads(2);

const flags = new Set((/^flags\s*:\s*(.*)$/m.exec(fs.readFileSync('/proc/cpuinfo', 'utf8'))?.[1] ?? '').split(/\s+/));
const has = (...f: string[]) => f.every((x) => flags.has(x));

test('every CPU loop of every instruction set this CPU runs matches fp64', () => {
  const rows = cpuKernelCheck(3);
  const isas = [...new Set(rows.map((r) => r.isa))];
  const expected = ['default'];
  if (process.arch === 'x64' && has('avx2', 'fma', 'f16c', 'bmi2')) expected.push('avx2');
  if (process.arch === 'x64' && has('avx512f', 'avx512bw', 'avx512vl', 'avx512dq', 'bmi2')) expected.push('avx512');
  expect(isas).toEqual(expected);
  expect(expected).toContain(info().cpuKernels);
  for (const r of rows) {
    // fp32: sums in fp32 lanes (the LM head's rows: 1e-7 to 9e-7 here); bf16: the attention's output
    // rounded to bf16 (2^-8 relative).
    const bound = r.dtype === 'float32' ? 2e-6 : r.kernel === 'linear' ? 2e-6 : 8e-3;
    expect({ ...r, ok: r.error <= bound }).toEqual({ ...r, ok: true });
  }
});

describe('decode steps on the CPU', () => {
  // Head size 64: the attention kernel's vectorised path (the tiny config's 16 takes the scalar one).
  const cfg = tinyConfig('qwen3', { headDim: 64, hiddenSize: 128, intermediateSize: 256 });
  const weights = randomWeights(cfg, 41);
  let fp32: NativeModel;
  beforeAll(async () => {
    fp32 = await loadModel(cfg, weights);
  });

  /** Greedy decode of three prompts at once; the tokens and their logprobs. */
  async function decode(
    model: NativeModel,
  ): Promise<{ prompts: number[][]; tokens: number[][]; logprobs: number[][] }> {
    const rng = new Rng(8);
    const prompts = [2, 19, 45].map((n) => randomTokens(rng, n, cfg.vocabSize));
    const { tokens, logprobs } = await greedyDecode(model, prompts, 24, {
      maxSequences: 4,
      maxSequenceLength: 96,
      blockSize: 16,
    });
    return { prompts, tokens, logprobs };
  }

  /** The largest difference of the decoded logprobs from an fp32 full forward over the same tokens. */
  async function errorAgainstFp32(run: Awaited<ReturnType<typeof decode>>): Promise<number> {
    const scores = await fp32.score(run.prompts.map((p, i) => packRow([[...p, ...run.tokens[i]]])));
    let err = 0;
    run.prompts.forEach((p, i) =>
      run.logprobs[i].forEach((lp, j) => (err = Math.max(err, Math.abs(lp - scores[i].logprobs[p.length + j])))),
    );
    return err;
  }

  test('fp32: decode (in-place GEMM, vectorised paged attention) equals the full forward (1e-5)', async () => {
    const run = await decode(fp32);
    expect(run.tokens.every((t) => t.length === 24)).toBe(true);
    expect(await errorAgainstFp32(run)).toBeLessThanOrEqual(1e-5);
  });

  test('bf16: decode stays within bf16 rounding of the fp32 forward, and close to a bf16 full forward', async () => {
    const bf16 = await loadModel(cfg, weights, { dtype: 'bfloat16' });
    const run = await decode(bf16);
    const err = await errorAgainstFp32(run);
    expect(err).toBeGreaterThan(0); // it did run in bf16
    expect(err).toBeLessThanOrEqual(0.05);
    // The bf16 full forward (the training path's ops) on the same tokens: as far from fp32.
    const scores = await bf16.score(run.prompts.map((p, i) => packRow([[...p, ...run.tokens[i]]])));
    let apart = 0;
    run.prompts.forEach((p, i) =>
      run.logprobs[i].forEach((lp, j) => (apart = Math.max(apart, Math.abs(lp - scores[i].logprobs[p.length + j])))),
    );
    expect(apart).toBeLessThanOrEqual(0.05);
  });
});
