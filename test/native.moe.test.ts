/**
 * Qwen3-MoE in the native engine beyond plain scoring (native.model / hf-reference / train /
 * generate tests cover logprobs, transformers parity, finite differences and KV-cache decode):
 * LoRA on expert projections, the router's load-balancing loss and load metrics, and router
 * replay from inference routes to training.
 */
import type { ArchConfig } from '../lib/model/arch';
import { tinyMoeConfig } from './support/tiny-moe';
import { decode, encode, packRow, randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';
import { setThreads, type LossConfig, type NativeModel, type TrainRow, type WeightTensor } from '../native';
import { loadModel } from '../lib/model/engine';

setThreads(2);

const cfg: ArchConfig = tinyMoeConfig;
const S = 2; // sparse layers
const K = 2;
const E = 4;

function trainRow(rng: Rng, lengths: number[]): TrainRow {
  const samples = lengths.map((n) => randomTokens(rng, n, cfg.vocabSize));
  const lossMask = samples.flatMap((s) => s.map((_, i) => (i >= s.length / 2 ? 1 : 0)));
  return {
    ...packRow(samples),
    lossMask,
    advantages: Float32Array.from(lossMask.map(() => rng.normal())),
    inferenceLogprobs: Float32Array.from(lossMask.map(() => -5)),
  };
}

const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
};

describe('LoRA on attention and expert projections', () => {
  const lora = { rank: 4, alpha: 8, dropout: 0, targetModules: ['q_proj', 'up_proj'] as ('q_proj' | 'up_proj')[] };

  test('PEFT names reach every expert; merged weights reproduce the adapted forward', async () => {
    const model = await loadModel(cfg, randomWeights(cfg, 5));
    const trainer = model.createTrainer({ lora, weightDecay: 0 });
    const names = (await trainer.readAdapters()).map((a) => a.name.replace('base_model.model.model.layers.', ''));
    const modules = [...new Set(names.map((n) => n.replace(/\.lora_[AB]\.weight$/, '')))];
    expect(modules).toEqual([
      '0.self_attn.q_proj',
      ...[0, 1, 2, 3].map((e) => `0.mlp.experts.${e}.up_proj`),
      '1.self_attn.q_proj',
      '1.mlp.up_proj',
      '2.self_attn.q_proj',
      ...[0, 1, 2, 3].map((e) => `2.mlp.experts.${e}.up_proj`),
    ]);
    const loss: LossConfig = { kind: 'grpo' };
    for (let i = 0; i < 3; i++) await trainer.step([trainRow(new Rng(40 + i), [16, 12])], { lr: 3e-2, loss });
    const { gradients } = await trainer.gradients([trainRow(new Rng(50), [20])], loss);
    // Every expert's adapter is trained (each saw tokens).
    for (const e of [0, 1, 2, 3]) {
      const g = gradients.find((t) => t.name.includes(`layers.0.mlp.experts.${e}.up_proj.lora_B`))!;
      expect(decode(g).some((v) => v !== 0)).toBe(true);
    }
    const merged = await loadModel(cfg, await trainer.readWeights());
    const probe = [packRow([randomTokens(new Rng(7), 24, cfg.vocabSize), randomTokens(new Rng(8), 9, cfg.vocabSize)])];
    const [adapted] = await trainer.score(probe);
    const [viaMerged] = await merged.score(probe);
    const [viaBase] = await model.score(probe);
    expect(maxAbsDiff(adapted.logprobs, viaMerged.logprobs)).toBeLessThanOrEqual(1e-5);
    expect(maxAbsDiff(adapted.logprobs, viaBase.logprobs)).toBeGreaterThan(1e-3);
  });
});

describe('router load-balancing loss and expert load', () => {
  const withZeroRouters = (weights: WeightTensor[]) =>
    weights.map((t) =>
      t.name.endsWith('mlp.gate.weight') ? { ...t, data: encode(new Float64Array(decode(t).length), t.dtype) } : t,
    );

  test('a uniform router gives exactly K; load metrics count (token, slot) pairs per expert', async () => {
    const model = await loadModel(cfg, withZeroRouters(randomWeights(cfg, 3)));
    const rows = [trainRow(new Rng(1), [10, 6]), trainRow(new Rng(2), [12])];
    const stats = await model.createTrainer().gradients(rows, { kind: 'ce' });
    // E * sum_e f_e * (1 / E) = sum_e f_e = K (each token's K slots are spread over the experts).
    expect(stats.metrics.router_aux_loss).toBeCloseTo(K, 6);
    expect(stats.metrics.expert_load_mean).toBeCloseTo((28 * K) / E, 9);
    expect(stats.metrics.expert_load_max).toBeGreaterThanOrEqual(stats.metrics.expert_load_mean);
    const dense = await loadModel(tinyConfig('qwen3'), randomWeights(tinyConfig('qwen3'), 3));
    const d = await dense.createTrainer().gradients(rows, { kind: 'ce' });
    // A dense model reports no MoE metrics (a run's metrics.jsonl has none).
    expect(Object.keys(d.metrics).filter((k) => /router|expert/.test(k))).toEqual([]);
    expect(d.metrics.loss).toBeGreaterThan(0);
  });

  test('the coefficient adds the loss; its gradients match finite differences (fp64)', async () => {
    const weights = randomWeights(cfg, 9, 'F64');
    const model = await loadModel(cfg, weights, { dtype: 'float64' });
    const trainer = model.createTrainer();
    const rows = [trainRow(new Rng(3), [9, 7])];
    const coef = 0.5;
    const off = await trainer.gradients(rows, { kind: 'ce' });
    const on = await trainer.gradients(rows, { kind: 'ce', routerAuxLossCoef: coef });
    expect(on.metrics.loss).toBeCloseTo(off.metrics.loss + coef * off.metrics.router_aux_loss, 9);
    // The aux loss reaches everything upstream of a router, but not the last sparse block's
    // experts nor the final norm (nothing after them feeds a router).
    on.gradients.forEach((g, i) => {
      const same = g.data.equals(off.gradients[i].data);
      if (g.name.endsWith('mlp.gate.weight')) expect([g.name, same]).toEqual([g.name, false]);
      if (/layers\.2\.mlp\.experts|model\.norm/.test(g.name)) expect([g.name, same]).toEqual([g.name, true]);
    });
    const router = weights.find((w) => w.name === 'model.layers.2.mlp.gate.weight')!;
    const grad = decode(on.gradients.find((g) => g.name === router.name)!);
    const lossAt = async (index: number, delta: number) => {
      const v = decode(router);
      v[index] += delta;
      await model.loadWeights([{ ...router, data: encode(v, 'F64') }], { strict: false });
      const r = await trainer.gradients(rows, { kind: 'ce', routerAuxLossCoef: coef });
      await model.loadWeights([router], { strict: false });
      return r.metrics.loss;
    };
    const h = 1e-5;
    for (const index of [0, 17, grad.length - 1]) {
      const fd = ((await lossAt(index, h)) - (await lossAt(index, -h))) / (2 * h);
      expect(Math.abs(fd - grad[index])).toBeLessThan(1e-7 + 1e-5 * Math.abs(fd));
    }
    await expect(trainer.gradients(rows, { kind: 'ce', routerAuxLossCoef: -1 })).rejects.toThrow(
      /routerAuxLossCoef must be >= 0/,
    );
  });
});

describe('router replay', () => {
  const prompt = [5, 17, 42, 99, 7, 3];

  /** Generates from `model` with routes; returns the sample as a training row with its routes and logprobs. */
  async function rollout(model: NativeModel, seed: number): Promise<{ row: TrainRow; logprobs: number[] }> {
    const gen = model.createGenerator({ maxSequences: 2, maxSequenceLength: 64 });
    await gen.add([{ promptIds: prompt, maxTokens: 20, temperature: 1, seed, returnRoutes: true }]);
    const tokens: number[] = [];
    const logprobs: number[] = [];
    const routes: number[] = [];
    for (let done = false; !done;) {
      const [t] = await gen.step();
      if (t.first) {
        // The prompt's routes come with the first token (tokens 0..P-2; the last one's are its own).
        expect(t.promptRoutes!.length).toBe((prompt.length - 1) * S * K);
        routes.push(...t.promptRoutes!);
      }
      expect(t.routes!.length).toBe(S * K);
      routes.push(...t.routes!);
      tokens.push(t.token);
      logprobs.push(t.logprob);
      done = t.finished;
    }
    routes.push(...new Array<number>(S * K).fill(-1)); // the last token was never fed
    const ids = [...prompt, ...tokens];
    expect(routes.every((e) => e >= -1 && e < E)).toBe(true);
    return {
      row: {
        ...packRow([ids]),
        lossMask: ids.map((_, i) => (i >= prompt.length ? 1 : 0)),
        advantages: ids.map(() => 1),
        inferenceLogprobs: [...prompt.map(() => 0), ...logprobs],
        routes,
      },
      logprobs,
    };
  }

  test('generation returns routes only when asked, and only for MoE models', async () => {
    const model = await loadModel(cfg, randomWeights(cfg, 4));
    const gen = model.createGenerator({ maxSequences: 2, maxSequenceLength: 32 });
    await gen.add([{ promptIds: prompt, maxTokens: 2 }]);
    const [first] = await gen.step();
    expect([first.first, first.promptRoutes, first.routes]).toEqual([true, undefined, undefined]);
    const dense = await loadModel(tinyConfig('qwen3'), randomWeights(tinyConfig('qwen3'), 4));
    const denseGen = dense.createGenerator({ maxSequences: 1, maxSequenceLength: 32 });
    await denseGen.add([{ promptIds: prompt, returnRoutes: true }]);
    const [d] = await denseGen.step();
    expect([d.promptRoutes, d.routes]).toEqual([undefined, undefined]);
  });

  test("replayed routes are the ones used; replaying a stale policy's routes cuts the mismatch KL from > 0.04 to < 0.012", async () => {
    const weights = randomWeights(cfg, 6);
    const trainerModel = await loadModel(cfg, weights);
    const trainer = trainerModel.createTrainer();
    const grpo: LossConfig = { kind: 'grpo' };
    // Same weights: replaying inference's own routes changes nothing.
    const same = await rollout(trainerModel, 1);
    const { routes: _r, ...plain } = same.row;
    const a = await trainer.gradients([same.row], grpo);
    const b = await trainer.gradients([plain], grpo);
    expect(Math.abs(a.metrics.loss - b.metrics.loss)).toBeLessThan(1e-6);
    expect(a.metrics.mismatch_kl).toBeLessThan(1e-9);
    // Other experts than the router's: the forward follows them.
    const shifted = { ...same.row, routes: same.row.routes!.map((e) => (e < 0 ? e : (e + 1) % E)) };
    expect(Math.abs((await trainer.gradients([shifted], grpo)).metrics.loss - b.metrics.loss)).toBeGreaterThan(1e-4);

    // Inference on older weights (routers perturbed, as after a few optimizer steps): with replay
    // the trainer sends each token through the experts that generated it.
    const rng = new Rng(11);
    const stale = weights.map((t) => {
      if (!t.name.endsWith('mlp.gate.weight')) return t;
      const v = decode(t).map((x) => x + 0.05 * rng.normal());
      return { ...t, data: encode(v, t.dtype) };
    });
    const inference = await loadModel(cfg, stale);
    let withReplay = 0;
    let without = 0;
    for (let seed = 0; seed < 6; seed++) {
      const { row } = await rollout(inference, seed);
      const { routes: _routes, ...recompute } = row;
      withReplay += (await trainer.gradients([row], grpo)).metrics.mismatch_kl;
      without += (await trainer.gradients([recompute], grpo)).metrics.mismatch_kl;
    }
    // Means over the 6 rollouts, deterministic (seeded sampling, fixed weights): 0.054 with the
    // trainer's own routes, 0.0084 replaying inference's (docs/algorithms.md, router replay). What replay
    // leaves is the perturbed routers' weights of the same experts, not a different set of experts.
    expect(without / 6).toBeGreaterThan(0.04);
    expect(withReplay / 6).toBeLessThan(0.012);
  });

  test('bad routes are rejected by name', async () => {
    const model = await loadModel(cfg, randomWeights(cfg, 4));
    const trainer = model.createTrainer();
    const row = trainRow(new Rng(5), [8]);
    await expect(trainer.gradients([{ ...row, routes: [0, 1] }])).rejects.toThrow(
      /row 0: routes has 2 entries, expected tokens x sparse layers x experts per token = 8 x 2 x 2/,
    );
    await expect(trainer.gradients([{ ...row, routes: new Array<number>(32).fill(E) }])).rejects.toThrow(
      /router replay: layer 0 names an expert outside \[0, 4\)/,
    );
    const dense = await loadModel(tinyConfig('qwen3'), randomWeights(tinyConfig('qwen3'), 4));
    await expect(dense.createTrainer().gradients([{ ...row, routes: [0] }])).rejects.toThrow(
      /row 0: routes given but the model has no MoE layers/,
    );
  });
});
