/** Native training: gradients vs finite differences, overfitting, clipping, bitwise checkpoint resume. */
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { info, setThreads, type TrainerOptions, type TrainRow, type WeightTensor } from '../native';
import { adamwCheck, lmHeadCheck } from '../native/checks';
import { loadModel } from '../lib/model/engine';
import { FAMILIES } from '../lib/model/families';
import { decode, encode, packRow, randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { lrAt } from '../lib/trainer/schedule';
import { Rng } from '../lib/model/rng';

setThreads(2);

/** A packed row of samples whose second half is the loss region (like prompt + completion). */
function trainRow(rng: Rng, lengths: number[], vocab: number): TrainRow {
  const samples = lengths.map((n) => randomTokens(rng, n, vocab));
  return { ...packRow(samples), lossMask: samples.flatMap((s) => s.map((_, i) => (i >= s.length / 2 ? 1 : 0))) };
}

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), 'prime-native-'));

describe.each(['llama', 'qwen2', 'qwen3', 'qwen3_moe'] as const)('%s', (arch) => {
  test('gradients match central finite differences (float64)', async () => {
    const cfg = tinyConfig(arch, { hiddenSize: 32, intermediateSize: 48, headDim: 8, vocabSize: 64 });
    const weights = randomWeights(cfg, 21, 'F64');
    const model = await loadModel(cfg, weights, { dtype: 'float64' });
    const trainer = model.createTrainer();
    const rng = new Rng(5);
    const rows = [trainRow(rng, [7, 5], cfg.vocabSize), trainRow(rng, [9], cfg.vocabSize)];
    const {
      metrics: { loss },
      gradients,
    } = await trainer.gradients(rows, { temperature: 0.8 });
    expect(loss).toBeGreaterThan(0);
    const lossAt = async (name: string, index: number, delta: number): Promise<number> => {
      const t = weights.find((w) => w.name === name)!;
      const v = decode(t);
      v[index] += delta;
      await model.loadWeights([{ ...t, data: encode(v, 'F64') }], { strict: false });
      const r = await trainer.gradients(rows, { temperature: 0.8 });
      await model.loadWeights([t], { strict: false });
      return r.metrics.loss;
    };
    // A few coordinates of every kind of tensor present for this architecture.
    const h = 1e-5;
    for (const g of gradients.filter(
      (_, i) => i % 3 === 0 || gradients[i].name.includes('norm') || gradients[i].name.includes('bias'),
    )) {
      const gv = decode(g as WeightTensor);
      for (const index of [0, Math.floor(gv.length / 2), gv.length - 1]) {
        const fd = ((await lossAt(g.name, index, h)) - (await lossAt(g.name, index, -h))) / (2 * h);
        expect(Math.abs(fd - gv[index])).toBeLessThan(1e-7 + 1e-5 * Math.abs(fd));
      }
    }
  });
});

describe('qwen3_moe: the router, every expert and the dense block', () => {
  // Layer 0 sparse (2 of 4 experts per token), layer 1 dense (mlp_only_layers).
  const E = 4;
  const cfg = tinyConfig('qwen3_moe', {
    hiddenSize: 32,
    intermediateSize: 48,
    headDim: 8,
    vocabSize: 64,
    moe: {
      ...FAMILIES.qwen3_moe.defaults.moe!,
      numExperts: E,
      numExpertsPerTok: 2,
      moeIntermediateSize: 16,
      mlpOnlyLayers: [1],
    },
  });

  test('gradients match central finite differences (float64) at coordinates of routed experts', async () => {
    const weights = randomWeights(cfg, 21, 'F64');
    const model = await loadModel(cfg, weights, { dtype: 'float64' });
    const trainer = model.createTrainer();
    const rng = new Rng(5);
    const samples = [randomTokens(rng, 9, cfg.vocabSize), randomTokens(rng, 7, cfg.vocabSize)];
    // The experts inference routes each token to: the prefill's, then the last token's (one decode step).
    const routes: number[] = [];
    for (const ids of samples) {
      const gen = model.createGenerator({ maxSequences: 1, maxSequenceLength: 32 });
      await gen.add([{ promptIds: ids, maxTokens: 1, temperature: 0, returnRoutes: true }]);
      const [first] = await gen.step();
      routes.push(...first.promptRoutes!, ...first.routes!);
    }
    const row: TrainRow = {
      ...packRow(samples),
      lossMask: samples.flatMap((s) => s.map((_, i) => (i >= s.length / 2 ? 1 : 0))),
    };
    const opts = { temperature: 0.8 };
    // Top-k routing is piecewise: each loss is also computed replaying the routes above, and the
    // two must agree, so no perturbation flipped a route (a flip would also break the difference).
    const lossNow = async (): Promise<number> => {
      const own = await trainer.gradients([row], opts);
      const replayed = await trainer.gradients([{ ...row, routes }], opts);
      expect(Math.abs(own.metrics.loss - replayed.metrics.loss)).toBeLessThan(1e-12);
      return own.metrics.loss;
    };
    await lossNow(); // the generator's routes are the trainer's own at these weights
    const { gradients } = await trainer.gradients([row], opts);
    const grad = (name: string) => decode(gradients.find((g) => g.name === name) as WeightTensor);
    const lossAt = async (name: string, index: number, delta: number): Promise<number> => {
      const t = weights.find((w) => w.name === name)!;
      const v = decode(t);
      v[index] += delta;
      await model.loadWeights([{ ...t, data: encode(v, 'F64') }], { strict: false });
      const loss = await lossNow();
      await model.loadWeights([t], { strict: false });
      return loss;
    };
    /** The coordinate of [from, to) with the largest gradient, which must be far from 0 (the check cannot pass at 0). */
    const largest = (g: Float64Array, from: number, to: number): number => {
      let at = from;
      for (let i = from; i < to; i++) if (Math.abs(g[i]) > Math.abs(g[at])) at = i;
      expect(Math.abs(g[at])).toBeGreaterThan(1e-4);
      return at;
    };
    // Every expert serves tokens here (2 route entries per token, one sparse layer).
    const served = Array.from({ length: E }, (_, e) => routes.filter((r) => r === e).length);
    expect(served.every((n) => n > 0)).toBe(true);
    const D = cfg.hiddenSize;
    const router = 'model.layers.0.mlp.gate.weight';
    const projections = ['gate_proj', 'up_proj', 'down_proj'];
    const thirds = (g: Float64Array) =>
      [0, 1, 2].map((k) => largest(g, Math.floor((k * g.length) / 3), Math.floor(((k + 1) * g.length) / 3)));
    const checks: [string, number[]][] = [
      // The router: the largest gradient in each expert's row.
      [router, Array.from({ length: E }, (_, e) => largest(grad(router), e * D, (e + 1) * D))],
      // Each expert's projections, and the dense block's MLP: the largest gradient in each third.
      ...Array.from({ length: E }, (_, e) => projections.map((p) => `model.layers.0.mlp.experts.${e}.${p}.weight`))
        .flat()
        .concat(projections.map((p) => `model.layers.1.mlp.${p}.weight`))
        .map((name): [string, number[]] => [name, thirds(grad(name))]),
    ];
    expect(checks).toHaveLength(1 + 3 * E + 3);
    const h = 1e-5;
    for (const [name, indices] of checks) {
      const g = grad(name);
      for (const index of indices) {
        const fd = ((await lossAt(name, index, h)) - (await lossAt(name, index, -h))) / (2 * h);
        expect([name, index, Math.abs(fd - g[index]) < 1e-7 + 1e-5 * Math.abs(fd)]).toEqual([name, index, true]);
      }
    }
  });
});

describe('training', () => {
  const cfg = tinyConfig('qwen2');
  const rng = new Rng(1);
  const rows = [trainRow(rng, [20, 12], cfg.vocabSize), trainRow(rng, [31], cfg.vocabSize)];

  test('overfits a tiny batch; reports tokens and pre-clip grad norm', async () => {
    const model = await loadModel(cfg, randomWeights(cfg, 2));
    const trainer = model.createTrainer({ weightDecay: 0 });
    const { gradients } = await trainer.gradients(rows);
    const norm = Math.sqrt(gradients.reduce((a, g) => a + decode(g).reduce((s, v) => s + v * v, 0), 0));
    const first = await trainer.step(rows, { lr: 3e-3, maxGradNorm: 0.1 });
    expect(first.metrics.grad_norm).toBeCloseTo(norm, 4);
    expect(first.metrics.tokens).toBe(63);
    expect(first.metrics.loss_tokens).toBe(10 + 6 + 15); // loss tokens that are not a sample's first token
    expect(first.metrics.tokens_per_s).toBeGreaterThan(0);
    let last = first;
    for (let i = 0; i < 40; i++) last = await trainer.step(rows, { lr: 3e-3, maxGradNorm: 1 });
    expect(last.metrics.loss).toBeLessThan(first.metrics.loss * 0.2);
    expect(trainer.stepCount).toBe(41);
  });

  test('a profiled step writes a time table by operator and a trace (libtorch 1.x: its legacy profiler, CPU operators)', async () => {
    const model = await loadModel(cfg, randomWeights(cfg, 2));
    const trainer = model.createTrainer();
    const prefix = path.join(tmp(), 'step');
    const stats = await trainer.step(rows, { lr: 1e-3, profile: prefix });
    expect(stats.metrics.tokens).toBe(63);
    expect(trainer.stepCount).toBe(1);
    const table = fs.readFileSync(`${prefix}.txt`, 'utf8');
    expect(table).toMatch(/^wall [\d.]+ ms; device busy/);
    expect(table).toMatch(/\| [\d.]+ \| \d+ \| aten::(mm|addmm|linear|matmul) \|/); // the operators the step ran
    if (info().torchVersion.startsWith('1.')) {
      // Self times too, and the engine's own named ranges (trainer.cc, lm_head.cc).
      expect(table).toMatch(/CPU operators \(self\)/);
      for (const name of ['prime::row_forward', 'prime::row_backward', 'prime::adamw'])
        expect(table).toContain(`| ${name} |`);
    }
    const trace = JSON.parse(fs.readFileSync(`${prefix}.json`, 'utf8')) as unknown[] | { traceEvents: unknown[] };
    expect((Array.isArray(trace) ? trace : trace.traceEvents).length).toBeGreaterThan(0);
  });

  test('sum loss with a given normaliser', async () => {
    const model = await loadModel(cfg, randomWeights(cfg, 2));
    const trainer = model.createTrainer();
    const mean = await trainer.gradients(rows);
    const sum = await trainer.gradients(rows, { normalizer: 1 });
    expect(sum.metrics.loss).toBeCloseTo(mean.metrics.loss * mean.metrics.loss_tokens, 3);
    // Splitting rows across calls with a shared normaliser gives the same total.
    const a = await trainer.gradients([rows[0]], { normalizer: mean.metrics.loss_tokens });
    const b = await trainer.gradients([rows[1]], { normalizer: mean.metrics.loss_tokens });
    expect(a.metrics.loss + b.metrics.loss).toBeCloseTo(mean.metrics.loss, 5);
  });

  test('checkpoint resume is bitwise: 4 steps == 2 + save + fresh engine + load + 2', async () => {
    const lrs = [1e-3, 2e-3, 3e-3, 4e-3];
    const stepRows = (i: number) => [trainRow(new Rng(100 + i), [16, 9], cfg.vocabSize)];
    const straight = await loadModel(cfg, randomWeights(cfg, 3));
    const t1 = straight.createTrainer();
    for (let i = 0; i < 4; i++) await t1.step(stepRows(i), { lr: lrs[i], maxGradNorm: 1 });

    const dir = tmp();
    const first = await loadModel(cfg, randomWeights(cfg, 3));
    const t2 = first.createTrainer();
    for (let i = 0; i < 2; i++) await t2.step(stepRows(i), { lr: lrs[i], maxGradNorm: 1 });
    await t2.save(dir);
    expect(fs.readdirSync(dir)).toEqual(['trainer.ckpt']);

    const resumed = await loadModel(cfg, randomWeights(cfg, 9)); // different weights: the checkpoint restores them
    const t3 = resumed.createTrainer();
    await t3.load(dir);
    expect(t3.stepCount).toBe(2);
    for (let i = 2; i < 4; i++) await t3.step(stepRows(i), { lr: lrs[i], maxGradNorm: 1 });

    const a = await straight.readWeights(),
      b = await resumed.readWeights();
    expect(a.every((t, i) => t.data.equals(b[i].data))).toBe(true);
    fs.rmSync(dir, { recursive: true });
  });

  test('corrupt, truncated, missing and mismatched checkpoints are rejected and change nothing', async () => {
    const model = await loadModel(cfg, randomWeights(cfg, 3));
    const trainer = model.createTrainer();
    await trainer.step(rows, { lr: 1e-3 });
    const dir = tmp();
    await trainer.save(dir);
    const file = path.join(dir, 'trainer.ckpt');
    const bytes = fs.readFileSync(file);
    const before = await model.readWeights();

    fs.writeFileSync(file, bytes.subarray(0, Math.floor(bytes.length / 2)));
    await expect(trainer.load(dir)).rejects.toThrow(/checkpoint '.*trainer.ckpt' is corrupt or incompatible/);
    fs.writeFileSync(file, Buffer.from('not a checkpoint at all'));
    await expect(trainer.load(dir)).rejects.toThrow(/corrupt or incompatible/);
    await expect(trainer.load(path.join(dir, 'nope'))).rejects.toThrow(/no checkpoint at/);

    fs.writeFileSync(file, bytes);
    const other = await loadModel(
      tinyConfig('qwen2', { numLayers: 1 }),
      randomWeights(tinyConfig('qwen2', { numLayers: 1 }), 3),
    );
    await expect(other.createTrainer().load(dir)).rejects.toThrow(/holds \d+ parameters, the model has \d+/);
    const after = await model.readWeights();
    expect(after.every((t, i) => t.data.equals(before[i].data))).toBe(true);
    expect(trainer.stepCount).toBe(1);
    fs.rmSync(dir, { recursive: true });
  });

  test('bad inputs', async () => {
    const model = await loadModel(cfg, randomWeights(cfg, 3));
    const trainer = model.createTrainer();
    await expect(trainer.step([{ ...rows[0], lossMask: [1] }], { lr: 1 })).rejects.toThrow(/same non-zero length/);
    await expect(
      trainer.step([{ inputIds: [1, 999], positionIds: [0, 1], lossMask: [1, 1] }], { lr: 1 }),
    ).rejects.toThrow(/token id 999/);
    await expect(trainer.step(rows, { lr: 1, loss: { kind: 'ppo' as 'ce' } })).rejects.toThrow(
      /unknown loss kind 'ppo'/,
    );
    await expect(trainer.step(rows, { lr: 1, loss: { kind: 'grpo' } })).rejects.toThrow(
      /row 0: loss 'grpo' needs advantages and inferenceLogprobs/,
    );
    const bf16 = await loadModel(cfg, randomWeights(cfg, 3), { dtype: 'bfloat16' });
    expect(() => bf16.createTrainer()).toThrow(/training keeps fp32 \(or fp64\) master weights/);
  });
});

describe('bf16 mixed precision (fp32 master weights and AdamW state, bf16 activations and matmuls)', () => {
  const cfg = tinyConfig('qwen3', { hiddenSize: 64, intermediateSize: 128, headDim: 16, vocabSize: 96 });
  const weights = randomWeights(cfg, 4);
  const rng = new Rng(11);
  const rows = [trainRow(rng, [20, 12], cfg.vocabSize), trainRow(rng, [31], cfg.vocabSize)];
  const lr = 1e-3;
  const maxDiff = (a: WeightTensor[], b: WeightTensor[]) =>
    Math.max(
      ...a.map((t, i) => {
        const [x, y] = [decode(t), decode(b[i])];
        return x.reduce((m, v, j) => Math.max(m, Math.abs(v - y[j])), 0);
      }),
    );

  test('a step lands near the fp32 step, computed in bf16, and the weights it leaves are fp32', async () => {
    const step = async (mixedPrecision?: 'bfloat16') => {
      const trainer = (await loadModel(cfg, weights)).createTrainer({ mixedPrecision });
      const stats = await trainer.step(rows, { lr, loss: { kind: 'ce' } });
      return { stats, weights: await trainer.readWeights('F32') };
    };
    const fp32 = await step();
    const bf16 = await step('bfloat16');
    const rel = (a: number, b: number) => Math.abs(a - b) / Math.abs(b);
    // bf16 products (8-bit mantissas) move the loss by rounding, not by a different computation.
    expect(rel(bf16.stats.metrics.loss, fp32.stats.metrics.loss)).toBeGreaterThan(1e-6);
    expect(rel(bf16.stats.metrics.loss, fp32.stats.metrics.loss)).toBeLessThan(2e-2);
    expect(rel(bf16.stats.metrics.grad_norm, fp32.stats.metrics.grad_norm)).toBeLessThan(5e-2);
    // AdamW's first step moves each weight by about lr in the direction of its gradient's sign: at
    // most 2 lr apart (a tiny gradient whose sign rounding flipped), and nearly all the same way.
    expect(maxDiff(bf16.weights, fp32.weights)).toBeLessThanOrEqual(2 * lr * (1 + 1e-3));
    let same = 0,
      all = 0;
    weights.forEach((w0, i) => {
      const [x0, a, b] = [decode(w0), decode(bf16.weights[i]), decode(fp32.weights[i])];
      x0.forEach((v, j) => {
        all++;
        if (Math.sign(a[j] - v) === Math.sign(b[j] - v)) same++;
      });
    });
    expect(same / all).toBeGreaterThan(0.97);
    // Master weights: after the update most values are not bf16-representable (low 16 bits set).
    for (const t of bf16.weights) {
      const bits = new Uint32Array(new Float32Array(decode(t)).buffer);
      const fine = bits.filter((b) => (b & 0xffff) !== 0).length;
      expect(fine).toBeGreaterThan(bits.length * 0.9);
    }
  });

  test("the forward is a bf16 model's: the step's loss is the one a bf16 copy of the model scores", async () => {
    // Loss-weighted mean of -logprob over the rows (the ce loss's normalisation: tokens in the mask).
    const ceOf = (scores: { logprobs: ArrayLike<number> }[]) => {
      let sum = 0,
        n = 0;
      rows.forEach((r, i) =>
        r.lossMask.forEach((m, t) => {
          if (m) ((sum -= scores[i].logprobs[t]), n++);
        }),
      );
      return sum / n;
    };
    const mixed = await (await loadModel(cfg, weights)).createTrainer({ mixedPrecision: 'bfloat16' }).step(rows, {
      lr,
      loss: { kind: 'ce' },
    });
    const bf16Loss = ceOf(await (await loadModel(cfg, weights, { dtype: 'bfloat16' })).score(rows));
    const fp32Loss = ceOf(await (await loadModel(cfg, weights)).score(rows));
    const rel = (a: number, b: number) => Math.abs(a - b) / Math.abs(b);
    // bf16 and fp32 forwards are told apart here (2.6e-4 apart); the mixed-precision step is the
    // bf16 one up to how each sums its products: 4e-8 when both ran libtorch's bf16 matmul, 5e-6
    // since a bf16 model's scoring on a CPU without bf16 dot products sums them in fp32 and rounds
    // once (native/src/cpu_matmul.h), while training keeps libtorch's. With fp32 activations between
    // the matmuls (autocast's scheme, this trainer's before) it was 1.0e-4 from the bf16 forward.
    expect(rel(bf16Loss, fp32Loss)).toBeGreaterThan(5e-5);
    expect(rel(mixed.metrics.loss, bf16Loss)).toBeLessThan(2e-5);
  });

  test("the LM head's recomputed logits equal the forward's: kept or recomputed chunks give the same gradients", async () => {
    const grads = async (logitsKeepBytes: number) => {
      const model = await loadModel(cfg, weights, { logitsChunkTokens: 8, logitsKeepBytes });
      return (await model.createTrainer({ mixedPrecision: 'bfloat16' }).gradients(rows, { temperature: 0.9 }))
        .gradients as WeightTensor[];
    };
    expect(maxDiff(await grads(0), await grads(1 << 30))).toBe(0);
  });

  test('bad settings are refused with what to do', async () => {
    const bf16Model = await loadModel(cfg, weights, { dtype: 'bfloat16' });
    expect(() => bf16Model.createTrainer()).toThrow(/fp32 \(or fp64\) master weights.*mixedPrecision bfloat16/);
    const fp64Model = await loadModel(cfg, randomWeights(cfg, 4, 'F64'), { dtype: 'float64' });
    expect(() => fp64Model.createTrainer({ mixedPrecision: 'bfloat16' })).toThrow(
      /needs the model's weights in float32/,
    );
    const fp32Model = await loadModel(cfg, weights);
    expect(() => fp32Model.createTrainer({ mixedPrecision: 'float16' as 'bfloat16' })).toThrow(
      /mixedPrecision 'float16' is not supported/,
    );
  });
});

describe('activation checkpointing (layers rerun in the backward)', () => {
  test.each(['llama', 'qwen3'] as const)(
    '%s: gradients and the step equal the plain ones (fp64; full fine-tuning and LoRA with dropout)',
    async (arch) => {
      const cfg = tinyConfig(arch, { hiddenSize: 32, intermediateSize: 48, headDim: 8, vocabSize: 64, numLayers: 3 });
      const weights = randomWeights(cfg, 31, 'F64');
      const rng = new Rng(2);
      const rows = [trainRow(rng, [7, 5], cfg.vocabSize), trainRow(rng, [9], cfg.vocabSize)];
      const lora = { rank: 4, alpha: 8, dropout: 0.2, targetModules: ['q_proj', 'v_proj', 'up_proj', 'down_proj'] };
      for (const opts of [{}, { lora, seed: 3 }] as TrainerOptions[]) {
        const run = async (activationCheckpointing: number) => {
          const model = await loadModel(cfg, weights, { dtype: 'float64' });
          const trainer = model.createTrainer({ ...opts, activationCheckpointing });
          // Two steps: the second's dropout masks come after the first's draws (the RNG stream).
          await trainer.step(rows, { lr: 1e-2, loss: { kind: 'ce' } });
          const g = await trainer.gradients(rows, { temperature: 0.8 });
          return { g, weights: await trainer.readWeights('F64') };
        };
        const plain = await run(0);
        for (const every of [1, 2]) {
          const ac = await run(every);
          expect(ac.g.metrics.loss).toBeCloseTo(plain.g.metrics.loss, 12);
          ac.g.gradients.forEach((t, i) => {
            const [a, b] = [decode(t as WeightTensor), decode(plain.g.gradients[i] as WeightTensor)];
            a.forEach((v, j) => expect(Math.abs(v - b[j])).toBeLessThan(1e-12));
          });
          ac.weights.forEach((t, i) => {
            const [a, b] = [decode(t), decode(plain.weights[i])];
            a.forEach((v, j) => expect(Math.abs(v - b[j])).toBeLessThan(1e-12));
          });
        }
      }
    },
  );

  test('under bf16 mixed precision the rerun takes the same autocast: gradients equal the plain ones', async () => {
    const cfg = tinyConfig('qwen3', { hiddenSize: 64, intermediateSize: 128, headDim: 16, vocabSize: 96 });
    const weights = randomWeights(cfg, 4);
    const rng = new Rng(11);
    const rows = [trainRow(rng, [20, 12], cfg.vocabSize)];
    const grads = async (activationCheckpointing: number) =>
      (
        await (
          await loadModel(cfg, weights)
        )
          .createTrainer({ mixedPrecision: 'bfloat16', activationCheckpointing })
          .gradients(rows, {})
      ).gradients as WeightTensor[];
    const [plain, ac] = [await grads(0), await grads(1)];
    ac.forEach((t, i) => {
      const [a, b] = [decode(t), decode(plain[i])];
      a.forEach((v, j) => expect(Math.abs(v - b[j])).toBeLessThanOrEqual(1e-6 * Math.max(1, Math.abs(b[j]))));
    });
  });

  test('refused for MoE models and for a bad value', async () => {
    const moe = tinyConfig('qwen3_moe');
    const model = await loadModel(moe, randomWeights(moe, 1));
    expect(() => model.createTrainer({ activationCheckpointing: 1 })).toThrow(/not supported for MoE models yet/);
    const cfg = tinyConfig('qwen3');
    const dense = await loadModel(cfg, randomWeights(cfg, 1));
    expect(() => dense.createTrainer({ activationCheckpointing: 1.5 })).toThrow(/integer >= 0/);
  });
});

test('learning-rate schedules', () => {
  expect(lrAt({ kind: 'constant', lr: 1, warmupSteps: 4 }, 0)).toBe(0.25);
  expect(lrAt({ kind: 'constant', lr: 1, warmupSteps: 4 }, 10)).toBe(1);
  expect(lrAt({ kind: 'linear', lr: 1, warmupSteps: 2, totalSteps: 12 }, 7)).toBeCloseTo(0.5);
  expect(lrAt({ kind: 'cosine', lr: 1, totalSteps: 10, minLr: 0.1 }, 5)).toBeCloseTo(0.55);
  expect(lrAt({ kind: 'cosine', lr: 1, totalSteps: 10 }, 10)).toBeCloseTo(0);
  expect(() => lrAt({ kind: 'linear', lr: 1 }, 0)).toThrow(/totalSteps/);
});

test.each(['float64', 'float32'] as const)(
  'the fused AdamW step equals libtorch AdamW (%s; weight decay, clipping scale, non-contiguous parameter)',
  (dtype) => {
    for (const [weightDecay, gradScale] of [
      [0, 1],
      [0.1, 0.25],
    ]) {
      const r = adamwCheck({ numel: 10007, steps: 5, weightDecay, gradScale, dtype, seed: 4 });
      expect(r.moved).toBeGreaterThan(1e-2); // five steps of lr 1e-2 moved the parameters
      expect(r.maxDiff).toBeLessThan(dtype === 'float64' ? 1e-14 : 1e-6);
    }
  },
);

describe('chunked LM head (logits never materialised for a whole row)', () => {
  test('values and gradients of logp and entropy match the full-logits graph (fp64)', () => {
    const base = { tokens: 11, hidden: 8, vocab: 37, seed: 3 };
    // Ragged chunks (3 + 3 + 3 + 2), one chunk, and each output's gradient alone; each with no
    // chunk, some and every chunk's log-softmax kept for the backward; temperature 1 skips the
    // division (tensor ops).
    for (const [chunkTokens, wLogp, wEntropy] of [
      [3, 1, 0.5],
      [0, 1, 0.5],
      [4, 1, 0],
      [4, 0, 1],
    ])
      for (const keepChunks of [0, 2, 4])
        for (const [tensorOps, temperature] of [
          [false, 0.7],
          [true, 0.7],
          [true, 1],
        ] as const) {
          // tensorOps: the path of logits on other devices (CUDA), checked here on the CPU.
          const r = lmHeadCheck({ ...base, temperature, chunkTokens, keepChunks, wLogp, wEntropy, tensorOps });
          expect(r.gradScale).toBeGreaterThan(1e-3);
          for (const d of [r.logp, r.entropy, r.gradHidden, r.gradWeight])
            expect(d).toBeLessThan(1e-12 * (1 + r.gradScale));
        }
  });

  test('fp32 (the fused row kernels with their vectorised exp, and the tensor ops) stays within fp32 rounding of the fp64 graph', () => {
    // A vocabulary of several exp blocks and logits spread wide enough that many underflow.
    const base = { tokens: 9, hidden: 16, vocab: 5000, temperature: 0.7, seed: 5, chunkTokens: 4, keepChunks: 1 };
    // The row kernels, and the tensor ops (CUDA's path) with the entropy's gradient and without.
    for (const [tensorOps, wEntropy] of [
      [false, 0.5],
      [true, 0.5],
      [true, 0],
    ] as const) {
      const r = lmHeadCheck({ ...base, wLogp: 1, wEntropy, dtype: 'float32', tensorOps });
      expect(r.gradScale).toBeGreaterThan(1e-3);
      // |logp| and the entropy are about log(5000) ~ 8.5 here: a few fp32 ulps of that.
      expect(r.logp).toBeLessThan(2e-5);
      expect(r.entropy).toBeLessThan(2e-5);
      expect(r.gradHidden).toBeLessThan(1e-5 * (1 + r.gradScale));
      expect(r.gradWeight).toBeLessThan(1e-5 * (1 + r.gradScale));
    }
  });

  test('a NaN in the LM head gives NaN logprobs and entropies for every predicted token, and a NaN loss (fp32)', async () => {
    const cfg = tinyConfig('llama', { vocabSize: 64 }); // untied: only the LM head is poisoned
    const weights = randomWeights(cfg, 6).map((t) => {
      if (t.name !== 'lm_head.weight') return t;
      const data = new Float32Array(t.data.buffer.slice(t.data.byteOffset, t.data.byteOffset + t.data.byteLength));
      data[5] = NaN; // one entry of one vocabulary row: every token's row of logits has a NaN
      return { ...t, data: Buffer.from(data.buffer) };
    });
    const trainer = (await loadModel(cfg, weights)).createTrainer();
    const rows = [trainRow(new Rng(3), [6, 5], cfg.vocabSize)];
    const [scores] = await trainer.score(rows, {});
    // Every predicted token (not the first of each sample, 0 and 6, which nothing predicts).
    const predicted = [1, 2, 3, 4, 5, 7, 8, 9, 10];
    for (const t of predicted) expect([scores.logprobs[t], scores.entropies[t]]).toEqual([NaN, NaN]);
    const st = await trainer.step(rows, { lr: 1e-3, loss: { kind: 'ce' } });
    expect(Number.isNaN(st.metrics.loss)).toBe(true);
  });

  test.each(['llama', 'qwen3'] as const)(
    '%s: a step chunked by 3 tokens equals one chunk, log-softmax kept or recomputed (grads, loss, entropy, KL, scores)',
    async (arch) => {
      // llama: untied LM head; qwen3: tied embedding (both grads reach the same weight).
      const cfg = tinyConfig(arch, { hiddenSize: 32, intermediateSize: 48, headDim: 8, vocabSize: 64 });
      const weights = randomWeights(cfg, 8, 'F64');
      const rng = new Rng(9);
      const rows: TrainRow[] = [trainRow(rng, [7, 5], cfg.vocabSize), trainRow(rng, [9], cfg.vocabSize)].map((r) => {
        const n = r.inputIds.length;
        const mask = Array.from(r.lossMask as number[]);
        return {
          ...r,
          advantages: Array.from({ length: n }, () => rng.normal()),
          inferenceLogprobs: mask.map((m) => (m ? -4 : 0)),
        };
      });
      const loss = { kind: 'grpo' as const, temperature: 0.8, klBeta: 0.1 };
      const run = async (logitsChunkTokens: number, logitsKeepBytes?: number) => {
        const model = await loadModel(cfg, weights, { dtype: 'float64', logitsChunkTokens, logitsKeepBytes });
        const trainer = model.createTrainer({ reference: true });
        await trainer.step(rows, { lr: 1e-2, loss }); // moves the policy off the reference
        return { ...(await trainer.gradients(rows, loss)), scores: await trainer.score(rows, { temperature: 0.8 }) };
      };
      // One chunk of 3 fp64 logits rows is 3 * 64 * 8 bytes: keep none, the first two, or all.
      const chunkBytes = 3 * cfg.vocabSize * 8;
      const whole = await run(0);
      for (const keep of [undefined, 2 * chunkBytes, 1 << 30]) {
        const chunked = await run(3, keep);
        expect(chunked.metrics.kl_divergence).toBeGreaterThan(0);
        for (const k of ['loss', 'entropy', 'kl_divergence'])
          expect(chunked.metrics[k]).toBeCloseTo(whole.metrics[k], 12);
        chunked.gradients.forEach((g, i) => {
          const a = decode(g as WeightTensor),
            b = decode(whole.gradients[i] as WeightTensor);
          a.forEach((v, j) => expect(Math.abs(v - b[j])).toBeLessThan(1e-12));
        });
        chunked.scores.forEach((s, i) => {
          s.logprobs.forEach((v, t) => expect(v).toBeCloseTo(whole.scores[i].logprobs[t], 6));
          s.entropies.forEach((v, t) => expect(v).toBeCloseTo(whole.scores[i].entropies[t], 6));
        });
      }
    },
  );

  test('logitsChunkTokens and logitsKeepBytes must be non-negative integers', async () => {
    const cfg = tinyConfig('qwen3');
    await expect(loadModel(cfg, randomWeights(cfg, 1), { logitsChunkTokens: 1.5 })).rejects.toThrow(
      /logitsChunkTokens must be an integer >= 0/,
    );
    await expect(loadModel(cfg, randomWeights(cfg, 1), { logitsKeepBytes: -1 })).rejects.toThrow(
      /logitsKeepBytes must be an integer >= 0/,
    );
  });
});
