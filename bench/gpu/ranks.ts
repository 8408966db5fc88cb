/**
 * Ranks of the data-parallel trainer in one process (each its own model, the collectives on libuv
 * worker threads), for the tests of c10d groups (test/native.dist.test.ts) and the GPU checks of
 * NCCL and of two ranks on one card (bench/gpu/checks.ts, which a bare GPU machine runs without
 * jest): a tiny Qwen3, packed GRPO rows of uneven lengths, ranks joined through a fresh TCP store.
 */
import * as native from '../../native';
import { createModelWithoutWeights, loadModel } from '../../lib/model/engine';
import { decode, packRow, randomTokens, randomWeights, tinyConfig } from '../../lib/model/testing';
import { Rng } from '../../lib/model/rng';
import { shardRows } from '../../lib/trainer/runtime';
import type { ArchConfig } from '../../lib/model/arch';
import { loadBaseShards } from '../../lib/trainer/shards';

export const cfg = tinyConfig('qwen3');

export const rowOf = (rng: Rng, lengths: number[]): native.TrainRow => {
  const samples = lengths.map((n) => randomTokens(rng, n, cfg.vocabSize));
  const row = packRow(samples);
  const n = row.inputIds.length;
  return {
    ...row,
    lossMask: samples.flatMap((s) => s.map((_, i) => (i >= s.length / 2 ? 1 : 0))),
    advantages: Array.from({ length: n }, (_, i) => ((i % 5) - 2) / 2),
    inferenceLogprobs: Array.from({ length: n }, () => -1.5),
  };
};
/** Five rows of uneven lengths per step: the ranks get different row counts. */
export const stepRows = (step: number) => {
  const rng = new Rng(100 + step);
  return [[20, 12], [31], [9, 9, 9], [17], [25, 4]].map((l) => rowOf(rng, l));
};
export const lossOf: native.LossConfig = { kind: 'grpo', temperature: 0.9 };
export const lrs = [2e-3, 3e-3, 1e-3, 2e-3];

export interface RankOptions {
  cfg?: ArchConfig;
  device?: string;
  backend?: native.DistBackend;
  dtype?: native.ComputeDType;
  trainer?: native.TrainerOptions;
  sharding?: native.Sharding;
  timeoutS?: number;
  /** An HF model folder each fully sharded rank fills its shards from (a model built without weights). */
  base?: string;
  loss?: native.LossConfig;
}

export interface Rank {
  model: native.NativeModel;
  trainer: native.Trainer;
  group: native.DistGroup;
}

/** `n` ranks joined through a fresh store; `bucketBytes` small enough to need several buckets. */
export async function joinRanks(n: number, o: RankOptions = {}) {
  const timeoutS = o.timeoutS ?? 20;
  const store0 = await native.createStore({ host: '127.0.0.1', port: 0, isServer: true, timeoutS });
  const stores = [store0];
  for (let r = 1; r < n; r++)
    stores.push(await native.createStore({ host: '127.0.0.1', port: store0.port(), timeoutS }));
  const prefix = `t${Math.random()}/`;
  const groups = await Promise.all(
    stores.map((store, rank) => native.createGroup(store, { prefix, rank, size: n, timeoutS, backend: o.backend })),
  );
  const c = o.cfg ?? cfg;
  const ranks: Rank[] = await Promise.all(
    groups.map(async (group) => {
      const options = { dtype: o.dtype, device: o.device };
      const model = o.base
        ? await createModelWithoutWeights(c, options)
        : await loadModel(c, randomWeights(c, 7), options);
      const trainer = model.createTrainer(o.trainer);
      trainer.setGroup(group, { bucketBytes: 4096, sharding: o.sharding });
      if (o.base) await loadBaseShards(trainer, o.base, c);
      return { model, trainer, group };
    }),
  );
  return { ranks, store0 };
}

/** Every rank steps its share of step `step`'s rows (of `rowsOf`). */
export const stepAll = (ranks: { trainer: native.Trainer }[], step: number, rowsOf = stepRows, loss = lossOf) =>
  Promise.all(
    ranks.map((r, rank) =>
      r.trainer.step(shardRows(rowsOf(step), rank, ranks.length), { lr: lrs[step], maxGradNorm: 1, loss }),
    ),
  );

/** One trainer over every row (world size 1, no group): each step's stats. */
export async function single(o: RankOptions, steps: number, rowsOf = stepRows) {
  const c = o.cfg ?? cfg;
  const model = await loadModel(c, randomWeights(c, 7), { dtype: o.dtype, device: o.device });
  const trainer = model.createTrainer(o.trainer);
  const stats: native.TrainStepStats[] = [];
  for (let s = 0; s < steps; s++)
    stats.push(await trainer.step(rowsOf(s), { lr: lrs[s], maxGradNorm: 1, loss: o.loss ?? lossOf }));
  return { model, trainer, stats };
}

/** Every rank's trained weights (or LoRA adapters): a collective under full sharding. */
export const readAll = (ranks: { trainer: native.Trainer }[], adapters = false) =>
  Promise.all(ranks.map((r) => (adapters ? r.trainer.readAdapters() : r.trainer.readWeights())));

/** The largest difference between two weight sets of the same names, relative to 1 + |value|. */
export function maxDiff(a: native.WeightTensor[], b: native.WeightTensor[]): number {
  let worst = 0;
  a.forEach((t, i) => {
    if (b[i]?.name !== t.name) throw new Error(`maxDiff: tensor ${i} is '${t.name}' and '${b[i]?.name}'`);
    const x = decode(t),
      y = decode(b[i]);
    for (let k = 0; k < x.length; k++) worst = Math.max(worst, Math.abs(x[k] - y[k]) / (1 + Math.abs(x[k])));
  });
  return worst;
}
