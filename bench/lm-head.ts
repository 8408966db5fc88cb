/**
 * The chunked LM head's two backward modes at the Qwen3 vocabulary, measured alternately in one
 * process: every chunk's log-softmax recomputed in the backward (`logitsKeepBytes: 0`, least
 * memory) against a 1 GiB budget, which keeps it from the forward (no second LM-head matmul; the
 * 512 MiB default keeps rows of up to 880 tokens whole).
 * Model: the Qwen3-shaped model of docs/benchmarks/compare.md (width 512, 8 layers, 8 / 4 heads, tied
 * embeddings, 151,936 tokens), random weights; one packed row per step, GRPO loss.
 *
 *   npm run build:ts && node dist/bench/lm-head.js [tokens=512] [rounds=3] [threads=2]
 *
 * Each mode's step is also split into fwd + bwd and grad norm + AdamW (medians). Another build of
 * the addon runs with PRIME_NATIVE_ADDON=<its prime_native.node>, for before/after figures.
 */
import { setThreads, type TrainRow } from '../native';
import { loadModel } from '../lib/model/engine';
import { packRow, randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';

const [tokens, rounds, threads] = [512, 3, 2].map((d, i) => Number(process.argv[2 + i] ?? d));

async function main(): Promise<void> {
  setThreads(threads);
  const cfg = tinyConfig('qwen3', {
    vocabSize: 151936,
    hiddenSize: 512,
    intermediateSize: 1536,
    numLayers: 8,
    numHeads: 8,
    numKvHeads: 4,
    headDim: 64,
    maxPositionEmbeddings: 4096,
    tieWordEmbeddings: true,
  });
  const weights = randomWeights(cfg, 1);
  const rng = new Rng(2);
  const samples = Array.from({ length: tokens / 128 }, () => randomTokens(rng, 128, cfg.vocabSize));
  const lossMask = samples.flatMap((s) => s.map((_, i) => (i >= 32 ? 1 : 0)));
  const row: TrainRow = {
    ...packRow(samples),
    lossMask,
    advantages: Float32Array.from(lossMask, () => rng.normal()),
    inferenceLogprobs: Float32Array.from(lossMask, (m) => (m ? -Math.log(cfg.vocabSize) : 0)),
  };
  const modes = [
    { name: 'recompute (logitsKeepBytes 0)', keep: 0 },
    { name: 'keep (logitsKeepBytes 1 GiB)', keep: 1 << 30 },
  ];
  const trainers = await Promise.all(
    modes.map(async (m) => (await loadModel(cfg, weights, { logitsKeepBytes: m.keep })).createTrainer({})),
  );
  const step = (i: number) => trainers[i].step([row], { lr: 1e-5, loss: { kind: 'grpo' } });
  for (let i = 0; i < modes.length; i++) await step(i); // warm-up
  const times: number[][] = modes.map(() => []);
  const phases: { fwdBwd: number[]; optimizer: number[] }[] = modes.map(() => ({ fwdBwd: [], optimizer: [] }));
  for (let r = 0; r < rounds; r++)
    for (let i = 0; i < modes.length; i++) {
      const t0 = process.hrtime.bigint();
      const st = await step(i);
      times[i].push(Number(process.hrtime.bigint() - t0) / 1e9);
      phases[i].fwdBwd.push(st.forwardBackwardSeconds);
      phases[i].optimizer.push(st.optimizerSeconds);
    }
  console.log(`one ${tokens}-token row, fwd+bwd+AdamW, ${threads} threads, ${rounds} alternating rounds`);
  modes.forEach((m, i) => {
    const s = [...times[i]].sort((a, b) => a - b);
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1].toFixed(3);
    console.log(`${m.name}: median ${s[s.length >> 1].toFixed(2)} s (${s.map((x) => x.toFixed(2)).join(', ')})`);
    console.log(`  of which fwd+bwd ${median(phases[i].fwdBwd)} s, grad norm + AdamW ${median(phases[i].optimizer)} s`);
  });
  const med = times.map((t) => [...t].sort((a, b) => a - b)[t.length >> 1]);
  console.log(`recompute / keep: ${(med[0] / med[1]).toFixed(2)}x`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
