/**
 * The trainer runtime's recovery contract: restoring a checkpoint and replaying the stored batches
 * gives bitwise the weights of an uninterrupted trainer, and a corrupt checkpoint is detected,
 * reported and skipped for the one before it.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as native from '../native';
import { readSafetensors, readSafetensorsDir } from '../lib/model/safetensors';
import { RunLayout } from '../lib/runfolder/layout';
import { rlTrainerSpec } from '../lib/trainer/spec';
import { TrainerRuntime } from '../lib/trainer/runtime';
import { randomBatches } from './support/batches';
import { rlConfig, tinyModel } from './support/setup';

native.setThreads(1);

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-trainer-'));
const modelDir = path.join(root, 'model');
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

const config = (extra: string[] = []) =>
  rlConfig([
    '--model.name',
    modelDir,
    '--seq-len',
    '64',
    '--max-steps',
    '6',
    '--trainer.optim.lr',
    '1e-3',
    '--trainer.loss.mismatch.mode',
    'tis',
    ...extra,
  ]);

const runWithBatches = (name: string, steps: number): RunLayout => randomBatches(path.join(root, name), steps);

const weightsOf = (dir: string) => new Map(readSafetensorsDir(dir).map((t) => [t.name, t.data]));

beforeAll(() => tinyModel(modelDir));

test('restore from a checkpoint + replay equals training straight through, bitwise', async () => {
  const spec = rlTrainerSpec(config());
  const straight = runWithBatches('straight', 4);
  const { runtime } = await TrainerRuntime.restore(straight.dir, spec, 0);
  for (let s = 0; s < 4; s++) await runtime.train(s);
  const expected = weightsOf(await runtime.writeWeights(4));

  // Same batches; the trainer "crashes" after step 2's checkpoint and a new one takes over at 4.
  const crashed = runWithBatches('crashed', 4);
  const first = (await TrainerRuntime.restore(crashed.dir, spec, 0)).runtime;
  await first.train(0);
  await first.train(1);
  await first.checkpoint();
  await first.train(2);
  const { runtime: second, report } = await TrainerRuntime.restore(crashed.dir, spec, 4);
  expect(report).toEqual({ from: 2, skipped: [], replayed: 2, rebuilt: [] });
  expect(second.progress.steps).toBe(4);
  const got = weightsOf(await second.writeWeights(4));
  expect([...got.keys()].sort()).toEqual([...expected.keys()].sort());
  for (const [name, data] of expected) expect(got.get(name)!.equals(data)).toBe(true);
});

test('a corrupt checkpoint is detected, reported and skipped for the previous one', async () => {
  const spec = rlTrainerSpec(config());
  const layout = runWithBatches('corrupt', 4);
  const rt = (await TrainerRuntime.restore(layout.dir, spec, 0)).runtime;
  await rt.train(0);
  await rt.checkpoint();
  await rt.train(1);
  await rt.train(2);
  await rt.checkpoint();
  const ckpt = path.join(layout.checkpointDir(3), 'trainer.ckpt');
  const bytes = fs.readFileSync(ckpt);
  bytes[bytes.length >> 1] ^= 0xff;
  fs.writeFileSync(ckpt, bytes);

  const { runtime, report } = await TrainerRuntime.restore(layout.dir, spec, 3);
  expect(report.from).toBe(1);
  expect(report.replayed).toBe(2);
  expect(report.skipped).toHaveLength(1);
  expect(report.skipped[0]).toContain(layout.checkpointDir(3));
  expect(report.skipped[0]).toContain('checksum mismatch');
  expect(runtime.progress.steps).toBe(3);
});

test('kl_penalty: the adaptive beta is logged, checkpointed, and the same after a restore', async () => {
  // target_kl far below any measured KL: beta rises 20% a step once the policy has moved; at
  // step 0 the policy is the reference (KL 0), so it first falls 20%.
  const spec = rlTrainerSpec(
    config([
      '--trainer.kl-penalty.enabled',
      '--trainer.kl-penalty.beta',
      '0.5',
      '--trainer.kl-penalty.target-kl',
      '1e-12',
    ]),
  );
  const straight = (await TrainerRuntime.restore(runWithBatches('kl-straight', 4).dir, spec, 0)).runtime;
  const metrics = [];
  for (let s = 0; s < 4; s++) metrics.push(await straight.train(s));
  expect(metrics[0].kl_divergence).toBe(0);
  for (const m of metrics.slice(1)) expect(m.kl_divergence).toBeGreaterThan(0);
  const betas = metrics.map((m) => m.kl_beta);
  [0.5, 0.4, 0.48, 0.576].forEach((b, i) => expect(betas[i]).toBeCloseTo(b, 12));
  expect(straight.klBeta).toBeCloseTo(0.6912, 12);

  const layout = runWithBatches('kl-crashed', 4);
  const first = (await TrainerRuntime.restore(layout.dir, spec, 0)).runtime;
  await first.train(0);
  await first.train(1);
  await first.checkpoint();
  expect(JSON.parse(fs.readFileSync(path.join(layout.checkpointDir(2), 'progress.json'), 'utf8')).klBeta).toBe(
    first.klBeta,
  );
  const restored = (await TrainerRuntime.restore(layout.dir, spec, 2)).runtime;
  expect(restored.klBeta).toBe(first.klBeta);
  expect((await restored.train(2)).kl_beta).toBe(betas[2]);
  const replayed = (await TrainerRuntime.restore(layout.dir, spec, 4)).runtime;
  expect(replayed.klBeta).toBe(straight.klBeta);

  // Off: no reference model, no KL term, beta 0 in the metrics.
  const off = (await TrainerRuntime.restore(runWithBatches('kl-off', 1).dir, rlTrainerSpec(config()), 0)).runtime;
  const offMetrics = await off.train(0);
  expect(offMetrics).toMatchObject({ kl_divergence: 0, kl_beta: 0 });
  // The engine's metrics pass through by the names metrics.jsonl records (a dense model: no MoE ones).
  expect(Object.keys(offMetrics).sort()).toEqual(
    [
      'loss',
      'entropy',
      'mismatch_kl',
      'mismatch_kl_masked',
      'mismatch_kl_unmasked',
      'masked_tokens',
      'masked_low',
      'masked_high',
      'masked_adv_positive',
      'masked_adv_negative',
      'masked_sequences',
      'clipped',
      'kl_divergence',
      'kl_beta',
      'grad_norm',
      'lr',
      'tokens',
      'loss_tokens',
      'loss_samples',
      'ce_loss',
      'ce_nll',
      'ce_tokens',
      'tokens_per_s',
      'seconds',
    ].sort(),
  );
});

test('with LoRA the weights folder holds the merged model and the PEFT adapters under lora/', async () => {
  const base = config();
  const spec = rlTrainerSpec({
    ...base,
    trainer: { ...base.trainer, lora: { ...base.trainer.lora, enabled: true, rank: 4 } },
  });
  const layout = runWithBatches('lora', 2);
  const { runtime } = await TrainerRuntime.restore(layout.dir, spec, 0);
  await runtime.train(0);
  await runtime.train(1);
  const dir = await runtime.writeWeights(2);
  const merged = weightsOf(dir);
  const original = weightsOf(modelDir);
  expect([...merged.keys()].sort()).toEqual([...original.keys()].sort());
  // Adapted projections moved away from the base weights; the rest (norms, embeddings) did not.
  expect(
    merged
      .get('model.layers.0.self_attn.q_proj.weight')!
      .equals(original.get('model.layers.0.self_attn.q_proj.weight')!),
  ).toBe(false);
  expect(merged.get('model.norm.weight')!.equals(original.get('model.norm.weight')!)).toBe(true);
  const adapterConfig = JSON.parse(fs.readFileSync(path.join(dir, 'lora', 'adapter_config.json'), 'utf8'));
  expect(adapterConfig).toMatchObject({ peft_type: 'LORA', r: 4 });
  const adapters = new Set(
    readSafetensors(path.join(dir, 'lora', 'adapter_model.safetensors')).tensors.map((t) => t.name),
  );
  expect(adapters.has('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight')).toBe(true);
  expect(adapters.has('base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight')).toBe(true);
});

test("policy weights are written in the base model's dtype: a bf16 model's are bf16, half the bytes of fp32", async () => {
  const bf16Model = tinyModel(path.join(root, 'model-bf16'), { dtype: 'bfloat16' });
  const base = config();
  const spec = rlTrainerSpec({
    ...base,
    trainer: { ...base.trainer, model: { ...base.trainer.model, name: bf16Model } },
  });
  const layout = runWithBatches('bf16', 1);
  const { runtime } = await TrainerRuntime.restore(layout.dir, spec, 0);
  await runtime.train(0);
  const dir = await runtime.writeWeights(1);
  const { tensors } = readSafetensors(path.join(dir, 'model.safetensors'));
  expect(new Set(tensors.map((t) => t.dtype))).toEqual(new Set(['BF16']));
  const values = tensors.reduce((a, t) => a + t.data.length / 2, 0);
  expect(fs.statSync(path.join(dir, 'model.safetensors')).size).toBeLessThan(values * 2 + 64 * 1024);
  // Trained: not the base model's values.
  const trained = weightsOf(dir).get('model.layers.0.mlp.down_proj.weight')!;
  expect(trained.equals(weightsOf(bf16Model).get('model.layers.0.mlp.down_proj.weight')!)).toBe(false);
  // An fp32 model's stay fp32.
  const { runtime: f32 } = await TrainerRuntime.restore(runWithBatches('f32', 1).dir, rlTrainerSpec(config()), 0);
  await f32.train(0);
  const f32Dir = await f32.writeWeights(1);
  expect(new Set(readSafetensors(path.join(f32Dir, 'model.safetensors')).tensors.map((t) => t.dtype))).toEqual(
    new Set(['F32']),
  );
});

test("ckpt.skip_optimizer: the resumed checkpoint's weights with AdamW afresh; skip_scheduler: the schedule starts again there", async () => {
  const layout = runWithBatches('skip', 4);
  const spec = rlTrainerSpec(config());
  const first = (await TrainerRuntime.restore(layout.dir, spec, 0)).runtime;
  await first.train(0);
  await first.train(1);
  await first.checkpoint();
  // The checkpoint's weights as a model folder: a trainer that starts from them has AdamW afresh.
  const at2 = await first.writeWeights(2);
  fs.copyFileSync(path.join(modelDir, 'config.json'), path.join(at2, 'config.json'));
  for (const f of fs.readdirSync(modelDir).filter((f) => f.startsWith('tokenizer')))
    fs.copyFileSync(path.join(modelDir, f), path.join(at2, f));
  const full = (await TrainerRuntime.restore(layout.dir, spec, 2)).runtime;
  await full.train(2);
  const withState = weightsOf(await full.writeWeights(3));

  const skip = rlTrainerSpec(config(['--ckpt.resume-step', '2', '--ckpt.skip-optimizer', 'true']));
  expect(skip.resume).toEqual({ step: 2, skipOptimizer: true, skipScheduler: false });
  const resumed = (await TrainerRuntime.restore(layout.dir, skip, 2)).runtime;
  await resumed.train(2);
  const fresh = weightsOf(await resumed.writeWeights(3));
  // A trainer started from the checkpoint's weights (no optimizer state) takes the same step, bitwise.
  const scratch = new RunLayout(path.join(root, 'skip-scratch'));
  fs.mkdirSync(path.dirname(scratch.batchFile(0)), { recursive: true });
  fs.copyFileSync(layout.batchFile(2), scratch.batchFile(0));
  const base = (await TrainerRuntime.restore(scratch.dir, rlTrainerSpec(config(['--model.name', at2])), 0)).runtime;
  await base.train(0);
  const want = weightsOf(await base.writeWeights(1));
  let differs = false;
  for (const [name, data] of want) {
    expect(fresh.get(name)!.equals(data)).toBe(true);
    differs ||= !withState.get(name)!.equals(data);
  }
  // The optimizer's state changes the step: skipping it is not a no-op.
  expect(differs).toBe(true);

  // skip_scheduler: a linear warmup of 2 steps starts again at the resume step.
  const warm = ['--trainer.scheduler.warmup-steps', '2', '--ckpt.resume-step', '2'];
  const lrAt2 = async (extra: string[]) =>
    (await (await TrainerRuntime.restore(layout.dir, rlTrainerSpec(config([...warm, ...extra])), 2)).runtime.train(2))
      .lr;
  expect(await lrAt2([])).toBeCloseTo(1e-3, 12); // past the warmup
  expect(await lrAt2(['--ckpt.skip-scheduler', 'true'])).toBeCloseTo(0.5e-3, 12); // its first step again
});
