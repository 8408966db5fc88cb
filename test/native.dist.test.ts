/**
 * The data-parallel trainer on c10d Gloo, two ranks in this process (each its own model, the
 * collectives on libuv worker threads): the same weights as one trainer over all rows, ZeRO-1
 * checkpoints that either world size loads, and collectives that fail instead of hanging.
 */
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import * as native from '../native';
import { createModelWithoutWeights, loadModel } from '../lib/model/engine';
import { randomWeights, tinyConfig } from '../lib/model/testing';
import { shardRows } from '../lib/trainer/runtime';
import { memoryPlan } from '../lib/trainer/plan';
import { loadCheckpoint, writeCheckpoint } from '../lib/trainer/shards';
import {
  cfg,
  joinRanks,
  lossOf,
  lrs,
  maxDiff,
  readAll,
  single,
  stepAll,
  stepRows,
  type RankOptions,
} from '../bench/gpu/ranks';
import { loadHfModel } from '../lib/model/hf';
import { tinyMoeConfig } from './support/tiny-moe';
import { tinyModel } from './support/setup';

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

const withKl: native.LossConfig = { ...lossOf, klBeta: 0.1 };
const twoRanks = (trainer: native.TrainerOptions = {}, timeoutS = 20) => joinRanks(2, { trainer, timeoutS });

test('shardRows: every row to exactly one rank, balanced by tokens, in batch order', () => {
  const rows = [5, 9, 3, 9, 1, 7].map((n) => ({ inputIds: new Array(n).fill(0) }));
  const parts = [0, 1, 2].map((r) => shardRows(rows, r, 3));
  expect(parts.flat().length).toBe(rows.length);
  expect(new Set(parts.flat()).size).toBe(rows.length);
  for (const p of parts)
    expect(p.map((r) => rows.indexOf(r))).toEqual([...p.map((r) => rows.indexOf(r))].sort((a, b) => a - b));
  const tokens = parts.map((p) => p.reduce((s, r) => s + r.inputIds.length, 0));
  expect(Math.max(...tokens) - Math.min(...tokens)).toBeLessThanOrEqual(9);
  expect(shardRows(rows, 0, 1)).toEqual(rows);
});

withGloo(
  'world size 2 (ZeRO-1, bucketed all-reduce) == world size 1 on the same rows; checkpoints cross over',
  async () => {
    const single = await loadModel(cfg, randomWeights(cfg, 7));
    const t1 = single.createTrainer();
    const singleStats: native.TrainStepStats[] = [];
    for (let s = 0; s < 4; s++)
      singleStats.push(await t1.step(stepRows(s), { lr: lrs[s], maxGradNorm: 1, loss: lossOf }));

    const { ranks } = await twoRanks();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-dist-'));
    for (let s = 0; s < 2; s++) {
      const [a, b] = await stepAll(ranks, s);
      // Metrics and the loss normaliser are the whole step's, the same on both ranks.
      expect(a.metrics.loss_tokens).toBe(singleStats[s].metrics.loss_tokens);
      expect(a.metrics.tokens).toBe(singleStats[s].metrics.tokens);
      expect(b.metrics.loss).toBe(a.metrics.loss);
      expect(a.metrics.loss).toBeCloseTo(singleStats[s].metrics.loss, 5);
      expect(a.metrics.grad_norm).toBeCloseTo(singleStats[s].metrics.grad_norm, 5);
    }
    // ZeRO-1 checkpoint: rank 0 gathers the optimizer shards and alone writes.
    await Promise.all(ranks.map((r, rank) => r.trainer.save(rank === 0 ? dir : '')));
    expect(fs.readdirSync(dir)).toEqual(['trainer.ckpt']);
    for (let s = 2; s < 4; s++) await stepAll(ranks, s);
    const w0 = await ranks[0].model.readWeights(),
      w1 = await ranks[1].model.readWeights(),
      ws = await single.readWeights();
    // Both ranks hold the same full weights (the owners' broadcast), equal to one trainer's up to
    // fp32 reduction order.
    expect(w0.every((t, i) => t.data.equals(w1[i].data))).toBe(true);
    expect(maxDiff(ws, w0)).toBeLessThan(1e-5);

    // The world-size-2 checkpoint, resumed by one trainer, gives the same weights (optimizer state
    // included: Adam's moments steer steps 3 and 4).
    const resumed = await loadModel(cfg, randomWeights(cfg, 9));
    const t2 = resumed.createTrainer();
    await t2.load(dir);
    expect(t2.stepCount).toBe(2);
    for (let s = 2; s < 4; s++) await t2.step(stepRows(s), { lr: lrs[s], maxGradNorm: 1, loss: lossOf });
    expect(maxDiff(ws, await resumed.readWeights())).toBeLessThan(1e-5);

    // And two fresh ranks load a checkpoint of one trainer, each keeping its shard.
    const oneDir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-dist-'));
    const again = await loadModel(cfg, randomWeights(cfg, 7));
    const t3 = again.createTrainer();
    for (let s = 0; s < 2; s++) await t3.step(stepRows(s), { lr: lrs[s], maxGradNorm: 1, loss: lossOf });
    await t3.save(oneDir);
    const fresh = await twoRanks();
    await Promise.all(fresh.ranks.map((r) => r.trainer.load(oneDir)));
    for (let s = 2; s < 4; s++) await stepAll(fresh.ranks, s);
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
    const single = await loadModel(cfg, randomWeights(cfg, 7));
    const t1 = single.createTrainer({ lora, seed: 3 });
    for (let s = 0; s < 2; s++) await t1.step(stepRows(s), { lr: lrs[s], maxGradNorm: 1, loss: lossOf });
    const { ranks } = await twoRanks({ lora, seed: 3 });
    for (let s = 0; s < 2; s++) await stepAll(ranks, s);
    expect(maxDiff(await t1.readAdapters(), await ranks[1].trainer.readAdapters())).toBeLessThan(1e-5);
  },
  60_000,
);

// ---------------------------------------------------------------------------------------------
// Full sharding (trainer.dist.sharding = "full", native/src/fsdp.h)

withGloo(
  'full sharding at world sizes 2 and 4 == world size 1: fp64 to reduction order, fp32 within 1e-5',
  async () => {
    for (const [dtype, tol, sizes] of [
      ['float64', 1e-12, [2, 4]],
      ['float32', 1e-5, [2]],
    ] as const) {
      const one = await single({ dtype }, 4);
      const scored = stepRows(9);
      const oneScores = await one.trainer.score(scored);
      for (const n of sizes) {
        const { ranks } = await joinRanks(n, { dtype, sharding: 'full' });
        for (let s = 0; s < 4; s++) {
          const stats = await stepAll(ranks, s);
          expect(stats[0].metrics.loss_tokens).toBe(one.stats[s].metrics.loss_tokens);
          expect(stats[1].metrics.loss).toBe(stats[0].metrics.loss);
          expect(Math.abs(stats[0].metrics.loss - one.stats[s].metrics.loss)).toBeLessThan(tol);
          expect(Math.abs(stats[0].metrics.grad_norm / one.stats[s].metrics.grad_norm - 1)).toBeLessThan(tol);
        }
        const weights = await readAll(ranks);
        expect(weights[1].every((t, i) => t.data.equals(weights[0][i].data))).toBe(true);
        expect(maxDiff(await one.trainer.readWeights(), weights[0])).toBeLessThan(tol);
        // Scoring gathers the layers too (every rank scores).
        const scores = await Promise.all(ranks.map((r) => r.trainer.score(scored)));
        scores[0].forEach((row, i) =>
          row.logprobs.forEach((lp, t) => expect(Math.abs(lp - oneScores[i].logprobs[t])).toBeLessThan(1e-5)),
        );
      }
    }
  },
  120_000,
);

const lora: native.LoraOptions = { rank: 4, alpha: 8, targetModules: ['q_proj', 'v_proj', 'down_proj'] };
const moeCfg = tinyMoeConfig;
/** stepRows with every token routed to experts 0 and 1 (router replay): experts 2 and 3 get no gradient. */
const moeRows = (step: number) =>
  stepRows(step).map((r) => ({ ...r, routes: Array.from({ length: r.inputIds.length * 4 }, (_, i) => i % 2) }));
const unusedExpert = 'model.layers.0.mlp.experts.2.gate_proj.weight';
const hybridCfg = tinyConfig('qwen3_5_text', { numLayers: 2 });
const usedExpert = 'model.layers.0.mlp.experts.0.gate_proj.weight';

test.each([
  [
    'LoRA (the frozen base sharded, the adapters ZeRO-1; the base is the KL reference)',
    { trainer: { lora, seed: 3 }, loss: withKl },
    stepRows,
    true,
  ],
  ['a KL penalty to a frozen reference, sharded too', { trainer: { reference: true }, loss: withKl }, stepRows, false],
  ['activation checkpointing', { trainer: { activationCheckpointing: 1 } }, stepRows, false],
  ['a tiny qwen3_moe, two experts per layer never routed to', { cfg: moeCfg }, moeRows, false],
  [
    'a tiny Qwen3.5 (a Gated DeltaNet block and a gated full-attention block; packed rows restart their state)',
    { cfg: hybridCfg },
    stepRows,
    false,
  ],
] as const)(
  'full sharding with %s == world size 1 (fp64)',
  async (_what, o, rowsOf, adapters) => {
    if (!gloo) return;
    const opts: RankOptions = { ...o, dtype: 'float64' };
    const one = await single(opts, 3, rowsOf);
    const { ranks } = await joinRanks(2, { ...opts, sharding: 'full' });
    for (let s = 0; s < 3; s++) await stepAll(ranks, s, rowsOf, opts.loss);
    const [sharded] = await readAll(ranks, adapters);
    const whole = await (adapters ? one.trainer.readAdapters() : one.trainer.readWeights());
    expect(maxDiff(whole, sharded)).toBeLessThan(1e-12);
    if (opts.cfg === hybridCfg) {
      // The Gated DeltaNet block's own parameters were trained, the same way on both sides.
      const initial = randomWeights(hybridCfg, 7);
      for (const name of ['conv1d.weight', 'A_log', 'dt_bias', 'norm.weight'].map(
        (p) => `model.layers.0.linear_attn.${p}`,
      )) {
        const named = (ts: native.WeightTensor[]) => [ts.find((t) => t.name === name)!];
        expect(maxDiff(named(initial), named(sharded))).toBeGreaterThan(1e-6);
      }
    }
    if (opts.cfg === moeCfg) {
      // An expert without a gradient is not stepped (no weight decay, no moments), as at world
      // size 1; the experts the tokens went to are.
      const initial = randomWeights(moeCfg, 7);
      const named = (ts: native.WeightTensor[], name: string) => [ts.find((t) => t.name === name)!];
      for (const ts of [whole, sharded]) {
        expect(maxDiff(named(initial, unusedExpert), named(ts, unusedExpert))).toBe(0);
        expect(maxDiff(named(initial, usedExpert), named(ts, usedExpert))).toBeGreaterThan(1e-4);
      }
    }
  },
  60_000,
);

withGloo(
  'fully sharded ranks built without weights read only their part of the base model folder == one trainer',
  async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-base-'));
    tinyModel(dir);
    const base = loadHfModel(dir);
    const vocab = base.config.vocabSize;
    const rowsOf = (s: number) =>
      stepRows(s).map((r) => ({ ...r, inputIds: Array.from(r.inputIds, (id) => id % vocab) }));
    const dtype = 'float64';
    const one = (await loadModel(base.config, base.tensors, { dtype })).createTrainer();
    for (let s = 0; s < 3; s++) await one.step(rowsOf(s), { lr: lrs[s], maxGradNorm: 1, loss: lossOf });
    const { ranks } = await joinRanks(4, { cfg: base.config, base: dir, dtype, sharding: 'full' });
    for (let s = 0; s < 3; s++) await stepAll(ranks, s, rowsOf);
    expect(maxDiff(await one.readWeights(), (await readAll(ranks))[0])).toBeLessThan(1e-12);
    // A model without weights trains only fully sharded.
    const bare = await createModelWithoutWeights(base.config);
    await expect(bare.createTrainer().step(rowsOf(0), { lr: 1e-3, loss: lossOf })).rejects.toThrow(
      /built without weights: only a fully sharded trainer/,
    );
    fs.rmSync(dir, { recursive: true });
  },
  60_000,
);

withGloo(
  "each rank's parameter, gradient and AdamW bytes fall as 1/N under full sharding (the engine's accounting)",
  async () => {
    const one = await single({}, 1);
    const whole = await one.trainer.memory();
    expect(whole.gradientBytes).toBe(whole.parameterBytes);
    expect(whole.optimizerBytes).toBe(2 * whole.parameterBytes);
    for (const n of [2, 4]) {
      const { ranks } = await joinRanks(n, { sharding: 'full' });
      await stepAll(ranks, 0);
      for (const m of await Promise.all(ranks.map((r) => r.trainer.memory())))
        for (const key of ['parameterBytes', 'gradientBytes', 'optimizerBytes'] as const)
          expect(Math.abs((m[key] * n) / whole[key] - 1)).toBeLessThan(0.1);
    }
    // ZeRO-1 shards only AdamW's state.
    const zero = await joinRanks(2);
    await stepAll(zero.ranks, 0);
    const m = await zero.ranks[0].trainer.memory();
    expect(m.parameterBytes).toBe(whole.parameterBytes);
    expect(Math.abs((m.optimizerBytes * 2) / whole.optimizerBytes - 1)).toBeLessThan(0.1);
  },
  60_000,
);

withGloo(
  "the memory plan's weights, gradients and AdamW state at world size 4 are what the ranks account (within 10%)",
  async () => {
    for (const sharding of ['full', 'optimizer'] as const) {
      const { ranks } = await joinRanks(4, { sharding });
      await stepAll(ranks, 0);
      const plan = memoryPlan({
        config: cfg,
        worldSize: 4,
        sharding,
        seqLen: 64,
        ac: false,
        dtype: 'float32',
        loraRank: 0,
      });
      // The plan's units are the engine's.
      expect(plan.units).toEqual(ranks[0].trainer.shardLayout().units.map((u) => ({ name: u.name, numel: u.numel })));
      const accounted = await Promise.all(ranks.map((r) => r.trainer.memory()));
      const largest = (key: keyof native.TrainerMemory) => Math.max(...accounted.map((m) => m[key]));
      expect(Math.abs(plan.weights / largest('parameterBytes') - 1)).toBeLessThan(0.1);
      expect(Math.abs(plan.gradients / largest('gradientBytes') - 1)).toBeLessThan(0.1);
      expect(Math.abs(plan.optimizer / largest('optimizerBytes') - 1)).toBeLessThan(0.1);
    }
  },
  60_000,
);

withGloo(
  'sharded checkpoints: written at world size 4, resumed at 2 (sharded or ZeRO-1) and 1; a whole one resharded at 4',
  async () => {
    const dtype = 'float64';
    const meta = { steps: 2, samples: 0, tokens: 0 };
    const expected = await (await single({ dtype }, 4)).trainer.readWeights();
    const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-shards-'));
    const dir = path.join(root, 'step_2');
    const four = await joinRanks(4, { dtype, sharding: 'full' });
    for (let s = 0; s < 2; s++) await stepAll(four.ranks, s);
    await Promise.all(four.ranks.map((r, rank) => writeCheckpoint(r.trainer, dir, rank, meta)));
    expect(fs.readdirSync(root)).toEqual(['step_2']);
    expect(fs.readdirSync(dir).sort()).toEqual([
      'index.json',
      'progress.json',
      ...[0, 1, 2, 3].map((r) => `shard-${r}-of-4.safetensors`),
      'trainer.ckpt',
    ]);
    const resumers = {
      'two sharded ranks': () => joinRanks(2, { dtype, sharding: 'full' }),
      'two ZeRO-1 ranks': () => joinRanks(2, { dtype }),
      'one trainer': async () => ({ ranks: [await single({ dtype }, 0)] }),
    };
    for (const [who, resume] of Object.entries(resumers)) {
      const { ranks } = await resume();
      await Promise.all(ranks.map((r) => loadCheckpoint(r.trainer, dir)));
      expect(ranks[0].trainer.stepCount).toBe(2);
      for (let s = 2; s < 4; s++) await stepAll(ranks, s);
      const [weights] = await readAll(ranks);
      expect({ who, close: maxDiff(expected, weights) < 1e-12 }).toEqual({ who, close: true });
    }
    // A checkpoint of one trainer (one file), resharded onto four ranks.
    const wholeDir = path.join(root, 'whole');
    await writeCheckpoint((await single({ dtype }, 2)).trainer, wholeDir, 0, meta);
    const again = await joinRanks(4, { dtype, sharding: 'full' });
    await Promise.all(again.ranks.map((r) => loadCheckpoint(r.trainer, wholeDir)));
    for (let s = 2; s < 4; s++) await stepAll(again.ranks, s);
    expect(maxDiff(expected, (await readAll(again.ranks))[0])).toBeLessThan(1e-12);
    // A damaged shard is refused, naming it, before anything is loaded; a rank that does not
    // read it loads.
    const shard1 = path.join(dir, 'shard-1-of-4.safetensors');
    const bytes = fs.readFileSync(shard1);
    bytes[bytes.length - 1] ^= 1;
    fs.writeFileSync(shard1, bytes);
    const two = await joinRanks(2, { dtype, sharding: 'full' });
    await expect(loadCheckpoint(two.ranks[0].trainer, dir)).rejects.toThrow(
      /shard-1-of-4.safetensors: checksum mismatch/,
    );
    expect(two.ranks[0].trainer.stepCount).toBe(0);
    await loadCheckpoint(two.ranks[1].trainer, dir);
    fs.rmSync(root, { recursive: true });
  },
  120_000,
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
