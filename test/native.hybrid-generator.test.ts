/**
 * A hybrid model (Qwen3.5: three Gated DeltaNet blocks and one full-attention block) served by the
 * generator through its state-slot cache kind, beside the paged KV blocks of the attention block:
 * sampled tokens' logprobs against the model's own packed forward (no cache), greedy tokens against
 * transformers' generate, and the scenarios whose bookkeeping native.paged.test.ts checks with the
 * state probe, here with the real recurrent state: prefix sharing (n completions, a group from the
 * cache, a next turn), preemption, weight updates (snapshots dropped), several decode steps per
 * call, and a storm that must leak no block or slot.
 */
import { setThreads, type GenerationRequest, type GeneratorOptions, type NativeModel } from '../native';
import { loadHfModel } from '../lib/model/hf';
import { loadModel } from '../lib/model/engine';
import { packRow, randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';
import { HF_FIXTURES } from './support/hf-fixtures';
import { expectSame, maxAbsDiff, serve, weightUpdateTests } from './support/serve';

setThreads(2);

// Blocks 0-2 Gated DeltaNet, block 3 full attention.
const cfg = tinyConfig('qwen3_5_text', { numLayers: 4 });
let model: NativeModel;
beforeAll(async () => {
  model = await loadModel(cfg, randomWeights(cfg, 31));
});
const base: GeneratorOptions = { maxSequences: 16, maxSequenceLength: 256, prefixSharing: 'off' };
const gen = (extra: Partial<GeneratorOptions> = {}, m = model) => m.createGenerator({ ...base, ...extra });
const rng = new Rng(8);
const prompt37 = randomTokens(rng, 37, cfg.vocabSize); // two full blocks of 16 and 5 more
const group = (prompt: number[], n: number, extra: Partial<GenerationRequest> = {}): GenerationRequest[] =>
  Array.from({ length: n }, (_, i) => ({ promptIds: prompt, maxTokens: 24, temperature: 1, seed: 100 + i, ...extra }));

test('the cache holds K/V for the attention block only, and a state slot per running sequence', () => {
  const g = gen({ kvCacheTokens: 256 });
  expect(g.stats()).toMatchObject({ numBlocks: 16, state: { slots: 16, inUse: 0, cached: 0 } });
  expect(gen({ stateSlots: 3 }).stats().state!.slots).toBe(3);
});

test.each([
  [16, 2048, 1],
  [4, 7, 1],
  [16, 16, 4],
])(
  'sampled logprobs equal the packed forward (fp32, 1e-4): blocks of %i, %i tokens per step, %i decode steps per call',
  async (blockSize, maxBatchedTokens, maxSteps) => {
    const prompts = [1, 5, 17, 70].map((n) => randomTokens(new Rng(5 + n), n, cfg.vocabSize));
    const g = gen({ maxSequences: 4, maxSequenceLength: 128, blockSize, maxBatchedTokens });
    const res = await serve(
      g,
      prompts.map((p, i) => ({ promptIds: p, temperature: 0.8, maxTokens: 20 + i, seed: i, promptLogprobs: true })),
      { maxSteps },
    );
    const full = await model.score(
      prompts.map((p, i) => packRow([[...p, ...res[i].tokens]])),
      { temperature: 0.8 },
    );
    const scored = await model.score(prompts.map((p) => packRow([p])));
    prompts.forEach((p, i) => {
      expect(res[i].tokens.length).toBe(20 + i);
      expect(maxAbsDiff(res[i].logprobs, full[i].logprobs.slice(p.length))).toBeLessThanOrEqual(1e-4);
      expect(maxAbsDiff(res[i].promptLogprobs!.slice(1), scored[i].logprobs.slice(1))).toBeLessThanOrEqual(1e-4);
    });
    expect(g.stats()).toMatchObject({ blocksInUse: 0, state: { inUse: 0 } });
  },
);

describe.each(HF_FIXTURES.filter((f) => f.meta.greedy_a).map((f) => [f.name, f] as const))(
  "transformers' fixture %s",
  (_, { dir, meta }) => {
    test("greedy tokens equal transformers' generate, prompt in chunks beside another sequence", async () => {
      const hf = loadHfModel(dir);
      const m = await loadModel(hf.config, hf.tensors);
      const g = m.createGenerator({ maxSequences: 2, maxSequenceLength: 256, blockSize: 4, maxBatchedTokens: 6 });
      const greedy = { promptIds: meta.tokens_a, maxTokens: meta.greedy_a!.length, temperature: 0 };
      const [alone, beside] = await serve(g, [greedy, { ...greedy, promptIds: meta.tokens_b }]);
      expect(alone.tokens).toEqual(meta.greedy_a);
      expect(beside.tokens.length).toBe(meta.greedy_a!.length);
    });
  },
);

describe('prefix sharing: the state at the end of a shared prefix is copied, never recomputed', () => {
  test.each(['live', 'cache'] as const)(
    'n completions of one prompt (%s): prefilled once, the same tokens as unshared',
    async (mode) => {
      const requests = group(prompt37, 6);
      const alone = gen();
      const unshared = await serve(alone, requests);
      expect(alone.stats().prefillTokens).toBe(6 * 37);
      const g = gen({ prefixSharing: mode });
      expectSame(await serve(g, requests), unshared, 1e-4);
      expect(g.stats()).toMatchObject({ prefillTokens: 37, prefixHitTokens: 5 * 37, blocksInUse: 0 });
      expect(g.stats().state!.inUse).toBe(0);
      expect(new Set(unshared.map((o) => o.tokens.join())).size).toBeGreaterThan(1);
    },
  );

  test("a group after its first rollout, and that rollout's next turn, resume from the cache's state snapshots", async () => {
    const requests = group(prompt37, 5);
    const unshared = await serve(gen(), requests);
    const g = gen({ prefixSharing: 'cache' });
    const out = [...(await serve(g, requests.slice(0, 1)))];
    expect(g.stats().state!.cached).toBeGreaterThan(0);
    out.push(...(await serve(g, requests.slice(1))));
    expectSame(out, unshared, 1e-4);
    // From the snapshot at 32 (the last block boundary before the last prompt token): 5 computed each.
    expect(g.stats()).toMatchObject({ prefillTokens: 37 + 4 * 5, prefixHitTokens: 4 * 32, blocksInUse: 0 });
    // The next turn of the first rollout: from its final state, kept with its partial block.
    const history = [...prompt37, ...out[0].tokens, 7, 8, 9];
    const next: GenerationRequest = { promptIds: history, maxTokens: 20, temperature: 0.9, seed: 5 };
    const before = g.stats();
    const [turn2] = await serve(g, [next]);
    expect(g.stats().prefixHitTokens - before.prefixHitTokens).toBe(37 + 24 - 1);
    expectSame([turn2], await serve(gen(), [next]), 1e-4);
  });
});

test.each(['off', 'live', 'cache'] as const)(
  'preempted sequences give back their blocks and slot and resume with the same tokens (sharing %s)',
  async (prefixSharing) => {
    const r = new Rng(12);
    const requests: GenerationRequest[] = Array.from({ length: 8 }, (_, i) => ({
      promptIds: i < 4 ? prompt37.slice(0, 6 + i) : randomTokens(r, 6 + i, cfg.vocabSize),
      maxTokens: 40,
      temperature: 1,
      seed: 7 + i,
    }));
    const roomy = await serve(gen(), requests);
    const g = gen({ maxSequences: 8, maxSequenceLength: 64, kvCacheTokens: 64, blockSize: 4, prefixSharing });
    let most = 0;
    const res = await serve(g, requests, {
      afterStep: () => {
        const s = g.stats();
        expect(s.state!.inUse).toBe(s.runningSequences);
        most = Math.max(most, s.runningSequences);
      },
    });
    expectSame(res, roomy, 1e-4);
    expect(g.stats().preemptions).toBeGreaterThan(0);
    expect(most).toBeGreaterThan(1);
    expect(g.stats()).toMatchObject({ activeSequences: 0, blocksInUse: 0, state: { inUse: 0 } });
  },
);

describe('weight updates', () => {
  weightUpdateTests(cfg, (m, o) => m.createGenerator(o), 1e-4);
});

test.each(['off', 'live', 'cache'] as const)(
  'never leaks a block or a slot: shared prompts, next turns, cancellations, stops, preemptions and weight updates (%s)',
  async (prefixSharing) => {
    const m = await loadModel(cfg, randomWeights(cfg, 51));
    const weights = [randomWeights(cfg, 52), randomWeights(cfg, 51)];
    const g = gen({ maxSequences: 6, maxSequenceLength: 96, kvCacheTokens: 160, blockSize: 8, prefixSharing }, m);
    const r = new Rng(21);
    const shared = randomTokens(r, 20, cfg.vocabSize);
    for (let round = 0; round < 3; round++) {
      const requests: GenerationRequest[] = Array.from({ length: 10 }, (_, i) => ({
        promptIds: i % 3 ? [...shared, ...randomTokens(r, i, cfg.vocabSize)] : randomTokens(r, 5 + i, cfg.vocabSize),
        maxTokens: 10 + 3 * i,
        temperature: 1,
        seed: round * 100 + i,
        stopTokenIds: i % 4 === 0 ? [11, 12, 13] : [],
      }));
      await serve(g, requests, {
        maxSteps: round + 1,
        afterStep: async (step, ids) => {
          const s = g.stats();
          expect(s.blocksInUse).toBeLessThanOrEqual(s.numBlocks);
          expect(s.state!.inUse).toBe(s.runningSequences);
          if (step === 3) await g.remove([ids[1]]);
          if (step === 6 && round === 1) await m.loadWeights(weights[round % 2]);
        },
      });
      expect(g.stats()).toMatchObject({ activeSequences: 0, blocksInUse: 0, state: { inUse: 0 } });
    }
  },
);
