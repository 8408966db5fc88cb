/**
 * Native engine throughput: matmul yardstick, prefill, batched decode and training, for a tiny
 * and a ~58M-parameter Llama-style model. Prints a markdown table.
 *
 *   npm run build && node dist/bench/native.js [threads]
 *
 * FLOPs: 2 * matmul params per token forward (6 * for training; prefill skips the LM head), plus
 * attention (QK^T and PV: 4 * layers * context * H * hd per token forward; mean context for causal).
 */
import type { ArchConfig } from '../lib/model/arch';
import { info, setThreads, type LossConfig, type NativeModel, type TrainerOptions, type TrainRow } from '../native';
import { matmulGflops } from '../native/checks';
import { loadModel } from '../lib/model/engine';
import { packRow, randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { parameterCount } from '../lib/model/tensors';
import { Rng } from '../lib/model/rng';

const threads = Number(require.main === module ? (process.argv[2] ?? 2) : 2);

const MEDIUM: ArchConfig = {
  arch: 'llama',
  vocabSize: 32000,
  hiddenSize: 512,
  intermediateSize: 1536,
  numLayers: 8,
  numHeads: 8,
  numKvHeads: 4,
  headDim: 64,
  rmsNormEps: 1e-6,
  ropeTheta: 10000,
  maxPositionEmbeddings: 4096,
  tieWordEmbeddings: false,
  attentionBias: false,
  qkNorm: false,
};

/** Parameters that take part in matmuls (all but the input embedding when untied). */
function matmulParams(c: ArchConfig, total: number): number {
  return c.tieWordEmbeddings ? total : total - c.vocabSize * c.hiddenSize;
}
/** Attention FLOPs of one token attending to `ctx` keys (QK^T + PV). */
const attnFlops = (c: ArchConfig, ctx: number) => 4 * c.numLayers * ctx * c.numHeads * c.headDim;

export interface Row {
  model: string;
  what: string;
  tokensPerSecond: number;
  gflops: number;
}

async function time<T>(f: () => Promise<T>): Promise<[T, number]> {
  const t0 = process.hrtime.bigint();
  const r = await f();
  return [r, Number(process.hrtime.bigint() - t0) / 1e9];
}

/**
 * Prefill, decode and training rows for model `c`. `activeParams` overrides the matmul parameters
 * a token goes through (MoE: the experts it is routed to, not all of them).
 */
export async function benchModel(name: string, c: ArchConfig, rows: Row[], activeParams?: number): Promise<void> {
  const model: NativeModel = await loadModel(c, randomWeights(c, 1));
  const P = activeParams ?? matmulParams(c, model.numParameters);
  // Prefill computes no logits (the last prompt token is decoded by the first step).
  const Pprefill = P - c.vocabSize * c.hiddenSize;
  const rng = new Rng(2);

  // Prefill: 4 prompts of 256 tokens.
  {
    const gen = model.createGenerator({ maxSequences: 4, maxSequenceLength: 512 });
    const reqs = Array.from({ length: 4 }, () => ({ promptIds: randomTokens(rng, 257, c.vocabSize) }));
    await gen.add([reqs[0]]); // warm-up
    await gen.remove([1]);
    const [, s] = await time(() => gen.add(reqs));
    const tokens = 4 * 256,
      flops = tokens * (2 * Pprefill + attnFlops(c, 128));
    rows.push({ model: name, what: 'prefill (4 x 256)', tokensPerSecond: tokens / s, gflops: flops / s / 1e9 });
  }
  // Decode: batch B, 64-token prompts, 32 steps timed after 2 warm-up steps.
  for (const B of [1, 16, 64]) {
    const gen = model.createGenerator({ maxSequences: B, maxSequenceLength: 160 });
    await gen.add(
      Array.from({ length: B }, (_, i) => ({ promptIds: randomTokens(rng, 64, c.vocabSize), maxTokens: 64, seed: i })),
    );
    for (let i = 0; i < 2; i++) await gen.step();
    const steps = 32;
    const [, s] = await time(async () => {
      for (let i = 0; i < steps; i++) await gen.step();
    });
    const tokens = B * steps,
      ctx = 64 + 2 + steps / 2;
    const flops = tokens * (2 * P + attnFlops(c, ctx));
    rows.push({ model: name, what: `decode batch ${B}`, tokensPerSecond: tokens / s, gflops: flops / s / 1e9 });
  }
  // Training: fwd+bwd+AdamW on 2 packed rows of 512 tokens (4 samples of 128 each): SFT's CE,
  // GRPO with TIS (adds the entropy metric and ratio terms), and GRPO on LoRA adapters (the last,
  // as LoRA freezes the model's weights).
  const variants: { what: string; options: TrainerOptions; loss: LossConfig }[] = [
    { what: 'ce', options: {}, loss: { kind: 'ce' } },
    { what: 'grpo+tis', options: {}, loss: { kind: 'grpo', mismatch: { mode: 'tis' } } },
    {
      what: 'grpo, LoRA r16 all linear',
      options: {
        lora: {
          rank: 16,
          alpha: 32,
          targetModules: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'],
        },
      },
      loss: { kind: 'grpo' },
    },
  ];
  for (const { what, options, loss } of variants) {
    const trainer = model.createTrainer(options);
    const row = (): TrainRow => {
      const samples = Array.from({ length: 4 }, () => randomTokens(rng, 128, c.vocabSize));
      const lossMask = samples.flatMap((s) => s.map((_, i) => (i >= 32 ? 1 : 0)));
      const advantages = Float32Array.from(samples.flatMap((s) => s.map(() => rng.normal())));
      const inferenceLogprobs = Float32Array.from(lossMask, (m) => (m ? -Math.log(c.vocabSize) : 0));
      return { ...packRow(samples), lossMask, advantages, inferenceLogprobs };
    };
    const batch = [row(), row()];
    await trainer.step(batch, { lr: 1e-4, maxGradNorm: 1, loss }); // warm-up
    const steps = 3;
    const [, s] = await time(async () => {
      for (let i = 0; i < steps; i++) await trainer.step(batch, { lr: 1e-4, maxGradNorm: 1, loss });
    });
    // LoRA still back-propagates through every layer's activations (not into the frozen weights).
    const flops = steps * 2 * 512 * ((options.lora ? 4 : 6) * P + 3 * attnFlops(c, 64)); // mean context 64
    rows.push({
      model: name,
      what: `train ${what} (2 x 512, fwd+bwd+AdamW)`,
      tokensPerSecond: (steps * 2 * 512) / s,
      gflops: flops / s / 1e9,
    });
  }
}

/** Prints rows as the markdown table of docs/benchmarks/engine-cpu.md, after the machine line. */
export function printTable(rows: Row[], peak: number, threads: number): void {
  const i = info();
  console.log(
    `libtorch ${i.torchVersion}, ${threads} threads (ATen ${i.threads}, BLAS ${i.blasThreads ?? '-'}), fp32 CPU; matmul 2048^3: ${peak.toFixed(1)} GFLOP/s\n`,
  );
  console.log('| model | workload | tokens/s | GFLOP/s | of matmul |');
  console.log('|---|---|---:|---:|---:|');
  for (const r of rows)
    console.log(
      `| ${r.model} | ${r.what} | ${r.tokensPerSecond.toFixed(0)} | ${r.gflops.toFixed(1)} | ${((100 * r.gflops) / peak).toFixed(0)}% |`,
    );
}

async function main(): Promise<void> {
  setThreads(threads);
  // The machine may be shared: take the better of two matmul measurements as the yardstick.
  let peak = await matmulGflops(2048, 10);
  const rows: Row[] = [];
  const tiny = tinyConfig('qwen3');
  const tinyParams = parameterCount(tiny),
    medParams = parameterCount(MEDIUM);
  await benchModel(`tiny qwen3 (${(tinyParams / 1e3).toFixed(0)}K)`, tiny, rows);
  await benchModel(`llama ${(medParams / 1e6).toFixed(1)}M`, MEDIUM, rows);
  peak = Math.max(peak, await matmulGflops(2048, 10));
  printTable(rows, peak, threads);
}

if (require.main === module)
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
