/**
 * What the state slots of hybrid models add to a generator, before a model with state layers
 * exists: a dense model through the state-slot cache kind with the probe as its state
 * (native/testing.ts). Their scenarios (sharing, preemption, weight updates, several decode steps,
 * storms) run with the paged ones in native.paged.test.ts; here: admission by slots, the stats and
 * /metrics that count them, and the option refused where there is no state.
 */
import { setThreads, type GenerationRequest, type GeneratorOptions, type NativeModel } from '../native';
import { createCheckedGenerator } from '../native/testing';
import { InferenceMetrics } from '../lib/inference/metrics';
import { Scheduler } from '../lib/inference/scheduler';
import { loadModel } from '../lib/model/engine';
import { randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';
import { expectSame, serve } from './support/serve';

setThreads(2);

const cfg = tinyConfig('qwen3');
let model: NativeModel;
beforeAll(async () => {
  model = await loadModel(cfg, randomWeights(cfg, 31));
});
const base: GeneratorOptions = { maxSequences: 16, maxSequenceLength: 256, prefixSharing: 'off' };
const probed = (extra: Partial<GeneratorOptions> = {}) =>
  createCheckedGenerator(model, { ...base, ...extra }, { stateProbe: true });
const prompt = randomTokens(new Rng(8), 37, cfg.vocabSize);
const group = (n: number, maxTokens = 24): GenerationRequest[] =>
  Array.from({ length: n }, (_, i) => ({ promptIds: prompt, maxTokens, temperature: 1, seed: 100 + i }));

test('a slot per running sequence: admission counts slots as it counts blocks', async () => {
  const requests = group(5, 6);
  const gen = probed({ stateSlots: 2 });
  let most = 0;
  const out = await serve(gen, requests, {
    afterStep: () => {
      const s = gen.stats();
      expect(s.state!.inUse).toBe(s.runningSequences);
      most = Math.max(most, s.runningSequences);
    },
  });
  expectSame(out, await serve(model.createGenerator(base), requests));
  expect(most).toBe(2);
  expect(gen.stats()).toMatchObject({ state: { slots: 2, inUse: 0, cached: 0 } });
  // By default maxSequences slots, twice that with 'cache' (the snapshots' share).
  expect(probed().stats().state!.slots).toBe(16);
  expect(probed({ prefixSharing: 'cache' }).stats().state!.slots).toBe(32);
  // A model without state layers has no slots, and no stats of them.
  expect(model.createGenerator(base).stats().state).toBeUndefined();
  expect(() => model.createGenerator({ ...base, stateSlots: 4 })).toThrow(
    'stateSlots: qwen3 has no state layers (only hybrid models have slots)',
  );
});

test("the server's /metrics count the state slots beside the blocks (hybrid models only)", async () => {
  const metricsOf = (gen: ReturnType<typeof probed>) =>
    new InferenceMetrics(new Scheduler(model, gen, { maxRunning: 16, maxQueued: 16 }, { version: 0, weightDir: '' }));
  const gen = probed({ prefixSharing: 'cache' });
  const metrics = metricsOf(gen);
  await serve(gen, group(2));
  const text = await metrics.registry.metrics();
  expect(text).toMatch(/^prime_inference_state_slots_total 32$/m);
  expect(text).toMatch(/^prime_inference_state_slots_in_use 0$/m);
  expect(text).toMatch(/^prime_inference_state_slots_cached [1-9]\d*$/m);
  expect(text).toMatch(/^prime_inference_kv_blocks_cached [1-9]\d*$/m);
  expect(await metricsOf(model.createGenerator(base)).registry.metrics()).not.toMatch(/state_slot/);
});
