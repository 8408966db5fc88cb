/**
 * The data-parallel trainer on c10d Gloo, two ranks in this process (each its own model, the
 * collectives on libuv worker threads): the same weights as one trainer over all rows, ZeRO-1
 * checkpoints that either world size loads, and collectives that fail instead of hanging.
 */
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import * as native from '../native';
import { decode, packRow, randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';
import { shardRows } from '../lib/trainer/runtime';

native.setThreads(1);

/**
 * A build without usable Gloo headers (native/CMakeLists.txt: libgloo-dev missing) has no process
 * groups and says so; Debian's libtorch 1.13 and PyTorch 2.x builds have them.
 */
const { gloo } = native.info();
const withGloo = gloo ? test : test.skip;

(gloo ? test.skip : test)('without Gloo, forming a group fails naming trainer.world_size', async () => {
  const store = await native.createStore({ host: '127.0.0.1', port: 0, isServer: true, timeoutS: 5 });
  await expect(native.createGroup(store, { prefix: 'x/', rank: 0, size: 1, timeoutS: 5 })).rejects.toThrow(
    /no c10d Gloo process group .*trainer\.world_size must be 1/,
  );
});

const cfg = tinyConfig('qwen3');
const rowOf = (rng: Rng, lengths: number[]): native.TrainRow => {
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
const stepRows = (step: number) => {
  const rng = new Rng(100 + step);
  return [[20, 12], [31], [9, 9, 9], [17], [25, 4]].map((l) => rowOf(rng, l));
};
const lossOf: native.LossConfig = { kind: 'grpo', temperature: 0.9 };
const lrs = [2e-3, 3e-3, 1e-3, 2e-3];

/** Two ranks joined through a fresh store; `bucketBytes` small enough to need several buckets. */
async function twoRanks(opts: native.TrainerOptions = {}, timeoutS = 20) {
  const store0 = await native.createStore({ host: '127.0.0.1', port: 0, isServer: true, timeoutS });
  const store1 = await native.createStore({ host: '127.0.0.1', port: store0.port(), timeoutS });
  const prefix = `t${Math.random()}/`;
  const [g0, g1] = await Promise.all([
    native.createGroup(store0, { prefix, rank: 0, size: 2, timeoutS }),
    native.createGroup(store1, { prefix, rank: 1, size: 2, timeoutS }),
  ]);
  const ranks = await Promise.all(
    [g0, g1].map(async (g) => {
      const model = await native.loadModel(cfg, randomWeights(cfg, 7));
      const trainer = model.createTrainer(opts);
      trainer.setGroup(g, 4096);
      return { model, trainer };
    }),
  );
  return { ranks, store0 };
}

const stepBoth = (ranks: { trainer: native.Trainer }[], step: number) =>
  Promise.all(
    ranks.map((r, rank) =>
      r.trainer.step(shardRows(stepRows(step), rank, 2), { lr: lrs[step], maxGradNorm: 1, loss: lossOf }),
    ),
  );

function maxDiff(a: native.WeightTensor[], b: native.WeightTensor[]): number {
  let worst = 0;
  a.forEach((t, i) => {
    expect(b[i].name).toBe(t.name);
    const x = decode(t),
      y = decode(b[i]);
    for (let k = 0; k < x.length; k++) worst = Math.max(worst, Math.abs(x[k] - y[k]) / (1 + Math.abs(x[k])));
  });
  return worst;
}

test('shardRows: every row to exactly one rank, balanced by tokens, in batch order', () => {
  const rows = [5, 9, 3, 9, 1, 7].map((n) => ({ inputIds: new Array(n).fill(0) }));
  const parts = [0, 1, 2].map((r) => shardRows(rows, r, 3));
  expect(parts.flat().length).toBe(rows.length);
  expect(new Set(parts.flat()).size).toBe(rows.length);
  for (const p of parts) expect(p.map((r) => rows.indexOf(r))).toEqual([...p.map((r) => rows.indexOf(r))].sort());
  const tokens = parts.map((p) => p.reduce((s, r) => s + r.inputIds.length, 0));
  expect(Math.max(...tokens) - Math.min(...tokens)).toBeLessThanOrEqual(9);
  expect(shardRows(rows, 0, 1)).toEqual(rows);
});

withGloo(
  'world size 2 (ZeRO-1, bucketed all-reduce) == world size 1 on the same rows; checkpoints cross over',
  async () => {
    const single = await native.loadModel(cfg, randomWeights(cfg, 7));
    const t1 = single.createTrainer();
    const singleStats: native.TrainStepStats[] = [];
    for (let s = 0; s < 4; s++)
      singleStats.push(await t1.step(stepRows(s), { lr: lrs[s], maxGradNorm: 1, loss: lossOf }));

    const { ranks } = await twoRanks();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-dist-'));
    for (let s = 0; s < 2; s++) {
      const [a, b] = await stepBoth(ranks, s);
      // Metrics and the loss normaliser are the whole step's, the same on both ranks.
      expect(a.lossTokens).toBe(singleStats[s].lossTokens);
      expect(a.tokens).toBe(singleStats[s].tokens);
      expect(b.loss).toBe(a.loss);
      expect(a.loss).toBeCloseTo(singleStats[s].loss, 5);
      expect(a.gradNorm).toBeCloseTo(singleStats[s].gradNorm, 5);
    }
    // ZeRO-1 checkpoint: rank 0 gathers the optimizer shards and alone writes.
    await Promise.all(ranks.map((r, rank) => r.trainer.save(rank === 0 ? dir : '')));
    expect(fs.readdirSync(dir)).toEqual(['trainer.ckpt']);
    for (let s = 2; s < 4; s++) await stepBoth(ranks, s);
    const w0 = await ranks[0].model.readWeights(),
      w1 = await ranks[1].model.readWeights(),
      ws = await single.readWeights();
    // Both ranks hold the same full weights (the owners' broadcast), equal to one trainer's up to
    // fp32 reduction order.
    expect(w0.every((t, i) => t.data.equals(w1[i].data))).toBe(true);
    expect(maxDiff(ws, w0)).toBeLessThan(1e-5);

    // The world-size-2 checkpoint, resumed by one trainer, gives the same weights (optimizer state
    // included: Adam's moments steer steps 3 and 4).
    const resumed = await native.loadModel(cfg, randomWeights(cfg, 9));
    const t2 = resumed.createTrainer();
    await t2.load(dir);
    expect(t2.stepCount).toBe(2);
    for (let s = 2; s < 4; s++) await t2.step(stepRows(s), { lr: lrs[s], maxGradNorm: 1, loss: lossOf });
    expect(maxDiff(ws, await resumed.readWeights())).toBeLessThan(1e-5);

    // And two fresh ranks load a checkpoint of one trainer, each keeping its shard.
    const oneDir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-dist-'));
    const again = await native.loadModel(cfg, randomWeights(cfg, 7));
    const t3 = again.createTrainer();
    for (let s = 0; s < 2; s++) await t3.step(stepRows(s), { lr: lrs[s], maxGradNorm: 1, loss: lossOf });
    await t3.save(oneDir);
    const fresh = await twoRanks();
    await Promise.all(fresh.ranks.map((r) => r.trainer.load(oneDir)));
    for (let s = 2; s < 4; s++) await stepBoth(fresh.ranks, s);
    expect(maxDiff(ws, await fresh.ranks[1].model.readWeights())).toBeLessThan(1e-5);
    fs.rmSync(dir, { recursive: true });
    fs.rmSync(oneDir, { recursive: true });
  },
  120_000,
);

withGloo(
  'LoRA: adapters only, the same as world size 1',
  async () => {
    const lora: native.LoraOptions = { rank: 4, alpha: 8, targetModules: ['q_proj', 'v_proj', 'down_proj'] };
    const single = await native.loadModel(cfg, randomWeights(cfg, 7));
    const t1 = single.createTrainer({ lora, seed: 3 });
    for (let s = 0; s < 2; s++) await t1.step(stepRows(s), { lr: lrs[s], maxGradNorm: 1, loss: lossOf });
    const { ranks } = await twoRanks({ lora, seed: 3 });
    for (let s = 0; s < 2; s++) await stepBoth(ranks, s);
    expect(maxDiff(await t1.readAdapters(), await ranks[1].trainer.readAdapters())).toBeLessThan(1e-5);
  },
  60_000,
);

withGloo(
  'a collective whose peer is gone fails within the timeout instead of hanging',
  async () => {
    const { ranks } = await twoRanks({}, 3);
    const started = Date.now();
    // Rank 1 never steps: rank 0's first collective (the loss normaliser) times out.
    await expect(ranks[0].trainer.step(shardRows(stepRows(0), 0, 2), { lr: 1e-3, loss: lossOf })).rejects.toThrow(
      /trainer process group: all-reduce failed/,
    );
    expect(Date.now() - started).toBeLessThan(20_000);
  },
  30_000,
);

test('store errors name the address', async () => {
  await expect(native.createStore({ host: '127.0.0.1', port: 1, timeoutS: 1 })).rejects.toThrow(
    /cannot reach the store at 127\.0\.0\.1:1/,
  );
  await expect(native.createStore({ host: '192.0.2.1', port: 0, isServer: true, timeoutS: 1 })).rejects.toThrow(
    /cannot listen on 192\.0\.2\.1:0/,
  );
}, 30_000);
