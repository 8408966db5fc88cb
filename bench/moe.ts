/**
 * Qwen3-MoE next to a dense Qwen3 of equal active parameters: the same attention, and per token
 * K experts of width I / K where the dense MLP has width I (plus the router). Prefill, batched
 * decode and training tokens/s through bench/native.ts's workloads; FLOPs count active parameters.
 *
 *   npm run build:ts && node dist/bench/moe.js [threads] [hidden] [layers]
 */
import type { ArchConfig } from '../lib/model/arch';
import { FAMILIES } from '../lib/model/families';
import { setThreads } from '../native';
import { matmulGflops } from '../native/checks';
import { tinyConfig } from '../lib/model/testing';
import { parameterCount, tensorSpecs } from '../lib/model/tensors';
import { benchModel, printTable, type Row } from './native';

const [threads, hidden, layers] = [2, 256, 4].map((d, i) => Number(process.argv[2 + i] ?? d));

/** Matmul parameters one token goes through: all but the unused experts (and an untied input embedding). */
function activeParams(c: ArchConfig): number {
  const k = c.moe?.numExpertsPerTok ?? 0;
  return tensorSpecs(c).reduce((n, s) => {
    const size = s.shape.reduce((a, b) => a * b, 1);
    if (s.slot === 'embed' && !c.tieWordEmbeddings) return n;
    if (s.expert !== undefined) return n + (size * k) / c.moe!.numExperts;
    return n + size;
  }, 0);
}

async function main(): Promise<void> {
  setThreads(threads);
  let peak = await matmulGflops(2048, 10);
  const base = {
    vocabSize: 4096,
    hiddenSize: hidden,
    intermediateSize: 4 * hidden,
    numLayers: layers,
    numHeads: 4,
    tieWordEmbeddings: true,
  };
  const dense = tinyConfig('qwen3', { ...base, numKvHeads: 2, headDim: hidden / 4, maxPositionEmbeddings: 1024 });
  const moe = tinyConfig('qwen3_moe', {
    ...base,
    numKvHeads: 2,
    headDim: hidden / 4,
    maxPositionEmbeddings: 1024,
    moe: { ...FAMILIES.qwen3_moe.defaults.moe!, numExperts: 8, numExpertsPerTok: 2, moeIntermediateSize: 2 * hidden },
  });
  const rows: Row[] = [];
  const label = (c: ArchConfig) =>
    `${c.arch} ${(parameterCount(c) / 1e6).toFixed(1)}M (${(activeParams(c) / 1e6).toFixed(1)}M active)`;
  await benchModel(label(dense), dense, rows, activeParams(dense));
  await benchModel(label(moe), moe, rows, activeParams(moe));
  peak = Math.max(peak, await matmulGflops(2048, 10));
  printTable(rows, peak, threads);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
