/**
 * The fused kernels' host side on a machine without a GPU (native/src/kernels.h): on the CPU the
 * fused implementation runs the CUDA kernels' own formulas as tensor ops, through the same autograd
 * functions, so the `gpu` tier's checks of each kernel against libtorch (bench/gpu/checks.ts) run
 * here on those formulas: their backward math, in-place RoPE under autograd, the LM head's fused
 * dispatch, a model's training step with `fusedKernels` on, and the refusals of bad inputs.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as native from '../native';
import { loadModel } from '../lib/model/engine';
import type { CheckContext } from '../bench/gpu/check';
import { CHECKS, makeWorkDir } from '../bench/gpu/checks';
import { loadConfig } from '../lib/config/loader';
import { RL_SECTIONS, RL_SHARED_KEYS, rlSchema } from '../lib/config/schemas';
import type { ArchConfig } from '../lib/model/arch';
import { decode, packRow, randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';
import type { LoraOptions, TrainRow } from '../native';
import { projectRoot } from '../lib/paths';

let ctx: CheckContext;
beforeAll(() => {
  ctx = { device: 'cpu', workDir: makeWorkDir(), python: 'python3' };
});
afterAll(() => fs.rmSync(ctx.workDir, { recursive: true, force: true }));

const fusedChecks = CHECKS.filter((c) => /^fused |fused kernels vs libtorch, fp32/.test(c.name));

test('the gpu tier has a check of each kernel, fp32 and bf16, and of a training step', () => {
  expect(fusedChecks.map((c) => c.name)).toEqual([
    'fused RMSNorm vs libtorch, fp32',
    'fused RMSNorm vs libtorch, bf16',
    'fused RMSNorm + residual add vs libtorch, fp32',
    'fused RMSNorm + residual add vs libtorch, bf16',
    'fused RoPE vs libtorch, fp32',
    'fused RoPE vs libtorch, bf16',
    'fused SwiGLU vs libtorch, fp32',
    'fused SwiGLU vs libtorch, bf16',
    'fused LM head rows vs libtorch, fp32',
    'fused LM head rows vs libtorch, bf16',
    'scoring and training step, fused kernels vs libtorch, fp32',
  ]);
});

test.each(fusedChecks.map((c) => [c.name, c] as const))(
  "%s, on the kernels' formulas (CPU)",
  async (_name, check) => {
    const r = await check.run(ctx);
    expect(`${r.status}: ${r.detail}`).toMatch(/^pass: /);
  },
  120_000,
);

/**
 * A training step with the fused kernels equals libtorch's on each family's layout: Llama (no q/k
 * norms: q and k are views of the projections, so RoPE works out of place), Qwen3 (RoPE in place
 * on the q/k norms' outputs, under activation checkpointing: the rerun layers run the autograd
 * functions again) with LoRA dropout, and Qwen3-MoE (SwiGLU on each expert's rows).
 */
describe('a training step with fusedKernels equals the unfused one', () => {
  const rows = (cfg: ArchConfig): TrainRow[] => {
    const rng = new Rng(4);
    const samples = [19, 30, 11].map((n) => randomTokens(rng, n, cfg.vocabSize));
    return [{ ...packRow(samples), lossMask: samples.flatMap((s) => s.map((_, i) => (i > 2 ? 1 : 0))) }];
  };
  const lora: LoraOptions = { rank: 4, alpha: 8, dropout: 0.2, targetModules: ['q_proj', 'k_proj', 'up_proj'] };
  test.each([
    ['llama', {}],
    ['qwen3', { activationCheckpointing: 1, lora, seed: 3 }],
    ['qwen3_moe', {}],
  ] as const)('%s', async (arch, opts) => {
    const cfg = tinyConfig(arch);
    const step = async (fusedKernels: boolean) => {
      const model = await loadModel(cfg, randomWeights(cfg, 2), { fusedKernels });
      const trainer = model.createTrainer({ ...opts, lora: 'lora' in opts ? { ...opts.lora } : undefined });
      return trainer.step(rows(cfg), { lr: 1e-3, loss: { kind: 'ce' } });
    };
    const [fused, plain] = [await step(true), await step(false)];
    expect(Math.abs(fused.metrics.loss - plain.metrics.loss) / plain.metrics.loss).toBeLessThan(1e-6);
    expect(Math.abs(fused.metrics.grad_norm - plain.metrics.grad_norm) / plain.metrics.grad_norm).toBeLessThan(1e-5);
    expect(plain.metrics.grad_norm).toBeGreaterThan(0);
  });
});

/**
 * LoRA on o_proj and down_proj only: q/k/v and gate/up stay fused projections while gradients flow
 * through them (to the earlier layers' adapters), so their outputs' gradients come back through
 * split (one tensor; not three narrows' zero-filled ones) and the packed SwiGLU. The step equals one
 * with each projection on its own, with libtorch's ops and with the fused kernels.
 */
test.each([false, true])(
  'fused projections under LoRA (gradients through split and the packed SwiGLU) equal separate ones, fusedKernels %s',
  async (fusedKernels) => {
    const cfg = tinyConfig('qwen3');
    const rng = new Rng(8);
    const samples = [23, 17].map((n) => randomTokens(rng, n, cfg.vocabSize));
    const rows: TrainRow[] = [{ ...packRow(samples), lossMask: samples.flatMap((s) => s.map(() => 1)) }];
    const step = async (fusedProjections: boolean) => {
      const model = await loadModel(cfg, randomWeights(cfg, 2), { fusedKernels, fusedProjections });
      const trainer = model.createTrainer({
        lora: { rank: 4, alpha: 8, targetModules: ['o_proj', 'down_proj'] },
        seed: 3,
      });
      await trainer.step(rows, { lr: 1e-3, loss: { kind: 'ce' } });
      const stats = await trainer.step(rows, { lr: 1e-3, loss: { kind: 'ce' } });
      return { stats, adapters: await trainer.readAdapters('F32') };
    };
    const [fused, separate] = [await step(true), await step(false)];
    expect(separate.stats.metrics.grad_norm).toBeGreaterThan(0);
    expect(Math.abs(fused.stats.metrics.grad_norm / separate.stats.metrics.grad_norm - 1)).toBeLessThan(1e-5);
    const a = fused.adapters.flatMap((t) => Array.from(decode(t))),
      b = separate.adapters.flatMap((t) => Array.from(decode(t)));
    expect(a.length).toBe(b.length);
    expect(Math.max(...a.map((x, i) => Math.abs(x - b[i])))).toBeLessThan(1e-6);
  },
);

describe('kernelCheck measures what it claims', () => {
  test('every output and input gradient, each path against fp64', () => {
    const rows = native.kernelCheck({ kernel: 'addRmsNorm', dtype: 'float32', device: 'cpu', rows: 9, width: 16 });
    expect(rows.map((r) => r.name)).toEqual(['sum', 'y', 'dx', 'dweight', 'ddelta']);
    for (const r of rows) {
      expect(r.scale).toBeGreaterThan(0.1); // not two zero gradients agreeing
      expect(r.fused).toBeLessThan(1e-5);
      expect(r.unfused).toBeLessThan(1e-5);
    }
  });
  test('bf16 errors are those of bf16 (so a bound on them means something)', () => {
    const [y] = native.kernelCheck({ kernel: 'swiglu', dtype: 'bfloat16', device: 'cpu', rows: 64, width: 64 });
    // One rounding to 8 significant bits: about 2^-9 of the largest value, and not zero.
    expect(y.fused).toBeGreaterThan(1e-4);
    expect(y.fused).toBeLessThan(8e-3);
  });
});

describe('bad inputs are refused by the kernels, naming what is wrong', () => {
  const base = { device: 'cpu', rows: 4, width: 8 } as const;
  test('a dtype the kernels do not take', () => {
    expect(() => native.kernelCheck({ ...base, kernel: 'rmsNorm', dtype: 'float64' })).toThrow(
      /fused RMSNorm: activations are Double; the fused kernels take float32 and bfloat16/,
    );
  });
  test("a norm weight of another width than the rows'", () => {
    expect(() => native.kernelCheck({ ...base, kernel: 'rmsNorm', dtype: 'float32', weightWidth: 6 })).toThrow(
      /fused RMSNorm: the weight has shape \[6\], expected \[8\]/,
    );
  });
  test('bf16 weights for fp32 activations, and a weight dtype for a kernel without a weight', () => {
    expect(() => native.kernelCheck({ ...base, kernel: 'rmsNorm', dtype: 'float32', weightDtype: 'bfloat16' })).toThrow(
      /fused RMSNorm: the weight is BFloat16 for activations in Float \(expected the same dtype/,
    );
    expect(() => native.kernelCheck({ ...base, kernel: 'rope', dtype: 'bfloat16', weightDtype: 'bfloat16' })).toThrow(
      /kernelCheck: weightDtype: rope has no weight/,
    );
  });
  test("a norm's row wider than its backward holds in registers", () => {
    expect(() => native.kernelCheck({ ...base, kernel: 'rmsNorm', dtype: 'float32', width: 8196 })).toThrow(
      /fused RMSNorm: rows of 8196 Float elements are wider than the kernels take at that size \(8192/,
    );
    expect(() => native.kernelCheck({ ...base, kernel: 'addRmsNorm', dtype: 'float32', width: 4098 })).toThrow(
      /rows of 4098 Float elements are wider than the kernels take at that size \(4096/,
    );
  });
  test('an odd head size for RoPE', () => {
    expect(() => native.kernelCheck({ ...base, kernel: 'rope', dtype: 'float32', width: 5 })).toThrow(
      /fused RoPE: q has shape \[4, 1, 5\], expected \[tokens, heads, an even head size\]/,
    );
  });
  test('fusedKernels: a model dtype without kernels, and a value that is not a boolean', async () => {
    const cfg = tinyConfig('qwen3');
    const weights = randomWeights(cfg, 1);
    await expect(loadModel(cfg, weights, { dtype: 'float64', fusedKernels: true })).rejects.toThrow(
      /fusedKernels: the fused kernels take float32 and bfloat16 models, not Double/,
    );
    await expect(loadModel(cfg, weights, { fusedKernels: 'yes' as unknown as boolean })).rejects.toThrow(
      /fusedKernels must be true or false/,
    );
  });
});

test('configs/gpu/rl-0.6b.toml: the RL loop at size as issue #38 sets it', () => {
  const { config: c } = loadConfig({
    schema: rlSchema,
    argv: ['@', path.join(projectRoot, 'configs', 'gpu', 'rl-0.6b.toml'), '--model.name', 'm'],
    env: {},
    cwd: projectRoot,
    shared: { keys: RL_SHARED_KEYS, sections: RL_SECTIONS },
  });
  expect(c.max_steps).toBe(30);
  expect(c.async_level).toBe(1);
  expect(c.orchestrator.batch_size).toBe(128);
  expect(c.orchestrator.sampling.max_tokens).toBe(128);
  expect(c.orchestrator.in_flight.enabled).toBe(true);
  expect(c.env.map((e) => e.id)).toEqual(['reverse-text']);
  expect([c.trainer.model.device, c.inference.model.device]).toEqual(['cuda', 'cuda']);
  expect([c.trainer.model.dtype, c.inference.model.dtype]).toEqual(['bfloat16', 'bfloat16']);
  // The inference share of the card: every rollout of a step decoding at once fits its KV cache.
  expect(c.inference.max_running).toBeGreaterThanOrEqual(c.orchestrator.batch_size);
  expect(c.inference.kv_cache_tokens).toBe(32768);
});
