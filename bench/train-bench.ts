/**
 * The engine's training step as the benchmarks time it (bench/compare.ts next to PyTorch,
 * bench/gpu/train-step.ts alone): packed rows of random tokens, CE on each sample's tokens from
 * `lossFrom` on, AdamW with clipping; a warm-up step, then `steps` timed ones. And the FLOPs such a
 * step does, for the model FLOPs utilisation (MFU) the GPU targets are set in.
 */
import * as path from 'node:path';
import type { NativeModel, TrainRow, TrainStepOptions, TrainStepStats } from '../native';
import type { ArchConfig } from '../lib/model/arch';
import { packRow, randomTokens } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';
import { parameterCount } from '../lib/model/tensors';

/** Dense bf16 peak of the card, TFLOP/s: PRIME_BENCH_PEAK_TFLOPS (default 989, H100 / H200 SXM). */
export const PEAK_TFLOPS = Number(process.env.PRIME_BENCH_PEAK_TFLOPS ?? 989);

/**
 * Parameters a token goes through as matmuls: all but the input embedding (a lookup); a tied
 * embedding is the LM head, counted once. A trained token costs 6 FLOPs per such parameter, a
 * decoded one 2 (attention left out).
 */
export function matmulParameters(c: ArchConfig): number {
  const total = parameterCount(c);
  return c.tieWordEmbeddings ? total : total - c.vocabSize * c.hiddenSize;
}

/** MFU in percent of `PEAK_TFLOPS` of `tokensPerSecond` trained tokens of model `c`. */
export const trainMfu = (c: ArchConfig, tokensPerSecond: number) =>
  (100 * 6 * matmulParameters(c) * tokensPerSecond) / (PEAK_TFLOPS * 1e12);

export interface TrainTiming {
  /** The model's vocabulary (the random tokens' range). */
  vocab: number;
  rows: number;
  /** Tokens per packed row. */
  rowLen: number;
  /** Samples per row (each rowLen / samples tokens). */
  samples: number;
  /** CE on tokens lossFrom.. of each sample (the tokens before stand for a prompt). */
  lossFrom: number;
  steps: number;
  /** bf16 mixed precision (fp32 master weights). */
  mixed: boolean;
  /** One more step under the profiler, its summary and trace at this path (not timed). */
  profile?: string;
}

/** Times `o.steps` training steps (after one warm-up) of a trainer of `model`. */
export async function timeTraining(
  model: NativeModel,
  o: TrainTiming,
): Promise<{ tokens: number; seconds: number; cpuSeconds: number; last?: TrainStepStats }> {
  const trainer = model.createTrainer({ mixedPrecision: o.mixed ? 'bfloat16' : undefined });
  const rng = new Rng(0);
  const V = o.vocab;
  const row = (): TrainRow => {
    const samples = Array.from({ length: o.samples }, () => randomTokens(rng, o.rowLen / o.samples, V));
    return { ...packRow(samples), lossMask: samples.flatMap((s) => s.map((_, i) => (i >= o.lossFrom ? 1 : 0))) };
  };
  const batch = Array.from({ length: o.rows }, row);
  const opts: TrainStepOptions = { lr: 1e-4, maxGradNorm: 1, loss: { kind: 'ce' } };
  await trainer.step(batch, opts); // warm-up
  const t0 = process.hrtime.bigint();
  const c0 = process.cpuUsage();
  let last: TrainStepStats | undefined;
  for (let i = 0; i < o.steps; i++) last = await trainer.step(batch, opts);
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  // CPU time of every thread of the process: less sensitive than wall time to a shared machine's load.
  const cpu = process.cpuUsage(c0);
  if (o.profile) await trainer.step(batch, { ...opts, profile: path.resolve(o.profile) });
  return { tokens: o.steps * o.rows * o.rowLen, seconds, cpuSeconds: (cpu.user + cpu.system) / 1e6, last };
}
