/**
 * The paged KV cache: decode over blocks against the full forward, prefix sharing, preemption,
 * weight updates, chunked prefill, several decode steps per call, and the block pool's accounting
 * under storms of requests, cancellations and preemptions. All on the real engine (CPU). The
 * scenarios run on each cache of support/serve.ts `KINDS`: the paged KV cache alone, and with the
 * state slots of hybrid models (their state the probe, checked at every forward), which must give
 * the same tokens; only where a hybrid cache can resume (at state snapshots) do the counts differ.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { setThreads, type GenerationRequest, type GeneratorOptions, type NativeModel } from '../native';
import { pagedDecodePlan } from '../native/checks';
import { loadModel } from '../lib/model/engine';
import { MODEL_PRESETS } from '../lib/model/create';
import { readHfConfigShape } from '../lib/model/hf';
import { packRow, randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';
import { projectRoot } from '../lib/paths';
import { QWEN3_0_6B, QWEN3_1_7B } from '../bench/shapes';
import { KINDS, expectSame, generatorOf, maxAbsDiff, serve, weightUpdateTests, type Out } from './support/serve';

setThreads(2);

const cfg = tinyConfig('qwen3');
let model: NativeModel;
beforeAll(async () => {
  model = await loadModel(cfg, randomWeights(cfg, 31));
});
const big = (extra: Partial<Parameters<NativeModel['createGenerator']>[0]> = {}) =>
  model.createGenerator({ maxSequences: 16, maxSequenceLength: 256, prefixSharing: 'off', ...extra });

test.each(
  KINDS.flatMap((kind) =>
    [
      [1, 2048],
      [4, 7],
      [16, 16],
    ].map(([blockSize, tokens]) => [kind, blockSize, tokens] as const),
  ),
)(
  'paged decode and chunked prefill equal a full forward (fp32, 1e-5; %s): blocks of %i, %i tokens per step',
  async (kind, blockSize, maxBatchedTokens) => {
    const rng = new Rng(5);
    const prompts = [1, 5, 17, 40].map((n) => randomTokens(rng, n, cfg.vocabSize));
    const gen = generatorOf(kind, model, { maxSequences: 4, maxSequenceLength: 96, blockSize, maxBatchedTokens });
    const res = await serve(
      gen,
      prompts.map((p, i) => ({ promptIds: p, temperature: 0.8, maxTokens: 20 + i, seed: i, promptLogprobs: true })),
    );
    const full = await model.score(
      prompts.map((p, i) => packRow([[...p, ...res[i].tokens]])),
      { temperature: 0.8 },
    );
    const prompt = await model.score(prompts.map((p) => packRow([p])));
    prompts.forEach((p, i) => {
      expect(res[i].tokens.length).toBe(20 + i);
      expect(maxAbsDiff(res[i].logprobs, full[i].logprobs.slice(p.length))).toBeLessThanOrEqual(1e-5);
      expect(Number.isNaN(res[i].promptLogprobs![0])).toBe(true);
      expect(maxAbsDiff(res[i].promptLogprobs!.slice(1), prompt[i].logprobs.slice(1))).toBeLessThanOrEqual(1e-5);
    });
    expect(gen.stats().blocksInUse).toBe(0);
  },
);

test('bf16: chunked prefill over cached keys is as close to fp32 as one chunk', async () => {
  const weights = randomWeights(cfg, 31);
  const bf16 = await loadModel(cfg, weights, { dtype: 'bfloat16' });
  const rng = new Rng(6);
  const prompts = [3, 30, 70].map((n) => randomTokens(rng, n, cfg.vocabSize));
  const requests = prompts.map((p, i) => ({ promptIds: p, maxTokens: 12, temperature: 0, seed: i }));
  const run = (maxBatchedTokens: number) =>
    serve(bf16.createGenerator({ maxSequences: 4, maxSequenceLength: 96, maxBatchedTokens }), requests);
  const whole = await run(2048);
  const chunked = await run(8); // prompts in chunks of up to 5 beside the decode rows
  const exactOf = async (res: Out[]) => {
    const rows = prompts.map((p, i) => packRow([[...p, ...res[i].tokens]]));
    const scores = await model.score(rows); // fp32, the same weights
    return scores.flatMap((sc, i) => Array.from(sc.logprobs.slice(prompts[i].length)));
  };
  const err = async (res: Out[]) => {
    const exact = await exactOf(res);
    return maxAbsDiff(
      res.flatMap((r) => r.logprobs),
      exact,
    );
  };
  expect(await err(chunked)).toBeLessThanOrEqual(2 * (await err(whole)) + 1e-3);
});

describe.each(KINDS)('shared prefixes (%s)', (kind) => {
  const hybrid = kind !== 'paged KV';
  const sharing = (extra: Partial<GeneratorOptions> = {}) =>
    generatorOf(kind, model, { maxSequences: 16, maxSequenceLength: 256, prefixSharing: 'off', ...extra });
  const rng = new Rng(8);
  const prompt37 = randomTokens(rng, 37, cfg.vocabSize); // two full blocks and a partial one
  const prompt32 = randomTokens(rng, 32, cfg.vocabSize); // two full blocks
  const group = (prompt: number[], n: number, extra: Partial<GenerationRequest> = {}): GenerationRequest[] =>
    Array.from({ length: n }, (_, i) => ({
      promptIds: prompt,
      maxTokens: 24,
      temperature: 1,
      seed: 100 + i,
      ...extra,
    }));

  test.each([
    ['a partial last block', prompt37],
    ['whole blocks', prompt32],
  ])(
    'n completions of one prompt (%s): prefilled once, copied on write, the same tokens and logprobs as unshared',
    async (_, prompt) => {
      const requests = group(prompt, 6);
      const alone = big();
      const unshared = await serve(alone, requests);
      expect(alone.stats().prefillTokens).toBe(6 * prompt.length);
      for (const mode of ['live', 'cache'] as const) {
        const gen = sharing({ prefixSharing: mode });
        expectSame(await serve(gen, requests), unshared);
        expect(gen.stats()).toMatchObject({ prefillTokens: prompt.length, prefixHitTokens: 5 * prompt.length });
        expect(gen.stats().blocksInUse).toBe(0);
      }
      // Different seeds gave different completions: they did part after the shared prompt.
      expect(new Set(unshared.map((o) => o.tokens.join())).size).toBeGreaterThan(1);
    },
  );

  test('a group sent as separate requests after the first was prefilled: full blocks from the cache, the rest computed', async () => {
    const requests = group(prompt37, 5);
    const unshared = await serve(big(), requests);
    const gen = sharing({ prefixSharing: 'cache' });
    const out: Out[] = [];
    // The first alone, to the end (its blocks parked in the cache), then the other four together.
    out.push(...(await serve(gen, requests.slice(0, 1))));
    expect(gen.stats().blocksCached).toBeGreaterThan(0);
    out.push(...(await serve(gen, requests.slice(1))));
    expectSame(out, unshared);
    // 37 = 2 blocks of 16 + 5: the others take the two blocks (hybrid: and the state snapshot at
    // 32, the last block boundary before the last token) and compute 5 positions each.
    expect(gen.stats()).toMatchObject({ prefillTokens: 37 + 4 * 5, prefixHitTokens: 4 * 32, blocksInUse: 0 });
    // A prompt of whole blocks: the others share them all and compute its last position again
    // (to sample from it), in a copy of the last block. Hybrid: a state is at hand at 16 only, so
    // they compute the second block.
    const whole = group(prompt32, 3);
    const wholeGen = sharing({ prefixSharing: 'cache' });
    const wholeOut = [...(await serve(wholeGen, whole.slice(0, 1))), ...(await serve(wholeGen, whole.slice(1)))];
    expectSame(wholeOut, await serve(big(), whole));
    const computedAgain = hybrid ? 16 : 1;
    expect(wholeGen.stats()).toMatchObject({
      prefillTokens: 32 + 2 * computedAgain,
      prefixHitTokens: 2 * (32 - computedAgain),
      blocksInUse: 0,
    });
    // 'live' keeps nothing once the first has finished.
    const live = sharing({ prefixSharing: 'live' });
    await serve(live, requests.slice(0, 1));
    expect(live.stats().blocksCached).toBe(0);
    await serve(live, requests.slice(1, 2));
    expect(live.stats().prefixHitTokens).toBe(0);
  });

  test("a multi-turn rollout's next turn continues its own history from the cache", async () => {
    const first: GenerationRequest = { promptIds: prompt37, maxTokens: 30, temperature: 0.9, seed: 4 };
    const gen = sharing({ prefixSharing: 'cache' });
    const [turn1] = await serve(gen, [first]);
    const history = [...prompt37, ...turn1.tokens, 7, 8, 9]; // the reply, then the next user message
    const second: GenerationRequest = { promptIds: history, maxTokens: 20, temperature: 0.9, seed: 5 };
    const before = gen.stats();
    const [turn2] = await serve(gen, [second]);
    // The first turn's K/V cover its prompt and reply but the last token: 66 positions, 4 full
    // blocks. Hybrid: its final state after those 66 is kept with its partial fifth block.
    const resumed = hybrid ? 66 : 64;
    expect(gen.stats().prefixHitTokens - before.prefixHitTokens).toBe(resumed);
    expect(gen.stats().prefillTokens - before.prefillTokens).toBe(history.length - resumed);
    expectSame([turn2], await serve(big(), [second]));
  });

  test('a leader that leaves mid-prefill hands the prefix to the follower sharing most', async () => {
    const requests = group(prompt37, 3);
    const expected = await serve(big(), requests.slice(1));
    const gen = sharing({ prefixSharing: 'live', maxBatchedTokens: 16 });
    const out = await serve(gen, requests, {
      afterStep: async (step, ids) => {
        if (step !== 0) return;
        // The first computed 16 positions, the others wait for its blocks: it is cancelled.
        expect(gen.stats()).toMatchObject({ cachedTokens: 16, prefillTokens: 16 });
        expect(await gen.remove([ids[0]])).toEqual([true]);
      },
    });
    expect(out[0].tokens).toEqual([]);
    expectSame(out.slice(1), expected);
    // Its 16 positions (hybrid: and its state there) stayed with the heir: 37 computed in all, not 16 + 37.
    expect(gen.stats()).toMatchObject({ prefillTokens: 37, blocksInUse: 0 });
  });

  test('a cached prompt that fills the whole pool runs again (its last position recomputed in place)', async () => {
    const request: GenerationRequest = { promptIds: prompt32, maxTokens: 1, temperature: 1, seed: 2 };
    const gen = generatorOf(kind, model, { maxSequences: 2, maxSequenceLength: 32, kvCacheTokens: 32 });
    const [first] = await serve(gen, [request]);
    expect(gen.stats().blocksCached).toBe(2);
    const [again] = await serve(gen, [request]);
    expectSame([again], [first]);
    // Hybrid: from the state at 16, the second block computed again in a block the cache gives back.
    const hit = hybrid ? 16 : 31;
    expect(gen.stats()).toMatchObject({
      prefillTokens: 64 - hit,
      prefixHitTokens: hit,
      blocksInUse: 0,
      blocksCached: 2,
    });
  });

  test('requests asking for prompt logprobs compute their whole prompt', async () => {
    const gen = sharing({ prefixSharing: 'cache' });
    await serve(gen, group(prompt37, 1));
    const [withPrompt] = await serve(gen, group(prompt37, 1, { promptLogprobs: true }));
    const [scored] = await model.score([packRow([prompt37])]);
    expect(maxAbsDiff(withPrompt.promptLogprobs!.slice(1), scored.logprobs.slice(1))).toBeLessThanOrEqual(1e-5);
    expect(gen.stats().prefixHitTokens).toBe(0);
  });
});

describe.each(KINDS)('preemption (%s)', (kind) => {
  // 8 prompts of 6..13 tokens, up to 40 new tokens each: up to 53 positions, 14 blocks of 4, in a
  // pool of 16 blocks. Half with penalties, a logit bias and min_tokens: their state goes with the
  // sequence through preemption, like its RNG.
  const rng = new Rng(12);
  const requests: GenerationRequest[] = Array.from({ length: 8 }, (_, i) => ({
    promptIds: randomTokens(rng, 6 + i, cfg.vocabSize),
    maxTokens: 40,
    temperature: 1,
    seed: 7 + i,
    ...(i % 2
      ? {
          presencePenalty: 1.5,
          frequencyPenalty: 0.5,
          logitBias: { tokenIds: [3, 4], biases: [2, -1] },
          minTokens: 30,
          stopTokenIds: [5, 6, 7],
        }
      : {}),
  }));

  test.each([
    ['off', false],
    ['cache', false],
    ['cache', true],
  ] as const)(
    'preempted and resumed sequences give the same tokens (sharing %s, tensor sampler %s)',
    async (prefixSharing, tensorSampler) => {
      const roomy = await serve(big({ tensorSampler }), requests);
      const gen = generatorOf(kind, model, {
        maxSequences: 8,
        maxSequenceLength: 64,
        kvCacheTokens: 64,
        blockSize: 4,
        prefixSharing,
        tensorSampler,
      });
      let most = 0;
      const res = await serve(gen, requests, {
        afterStep: () => {
          const s = gen.stats();
          expect(s.blocksInUse).toBeLessThanOrEqual(s.numBlocks);
          most = Math.max(most, s.runningSequences);
        },
      });
      expectSame(res, roomy, 1e-4);
      expect(gen.stats().preemptions).toBeGreaterThan(0);
      expect(most).toBeGreaterThan(1);
      expect(gen.stats()).toMatchObject({ activeSequences: 0, blocksInUse: 0 });
    },
  );

  test('the lowest priority is preempted first and resumes last', async () => {
    // Two sequences growing in a pool that holds one at its end: the one of priority 1 waits.
    const gen = generatorOf(kind, model, { maxSequences: 2, maxSequenceLength: 64, kvCacheTokens: 48, blockSize: 4 });
    const [high, low] = [0, 1].map((priority) => ({
      promptIds: [1, 2, 3],
      maxTokens: 40,
      temperature: 0,
      priority,
    }));
    // The low-priority one is admitted first: priority, not arrival, decides.
    const [{ seqId: lowId }] = await gen.add([low]);
    const [{ seqId: highId }] = await gen.add([high]);
    const order: number[] = [];
    while (gen.stats().activeSequences > 0) for (const t of await gen.step()) if (t.finished) order.push(t.seqId);
    expect(order).toEqual([highId, lowId]);
    expect(gen.stats().preemptions).toBeGreaterThan(0);
  });
});

describe.each(KINDS)('weight updates (%s)', (kind) => {
  weightUpdateTests(cfg, (m, o) => generatorOf(kind, m, o));
});

test('a long prompt is prefilled in chunks beside the decoding sequences, which get a token every step', async () => {
  const gen = model.createGenerator({ maxSequences: 4, maxSequenceLength: 600, maxBatchedTokens: 64 });
  await gen.add([{ promptIds: [1, 2, 3], maxTokens: 200, temperature: 0 }]);
  await gen.step(); // its first token
  const [{ seqId: longId }] = await gen.add([
    { promptIds: randomTokens(new Rng(2), 500, cfg.vocabSize), maxTokens: 2 },
  ]);
  let steps = 0;
  for (let got = false; !got; steps++) {
    const tokens = await gen.step();
    expect(tokens.filter((t) => t.seqId !== longId).length).toBe(1); // the running one: never stalled
    got = tokens.some((t) => t.seqId === longId);
  }
  // 500 positions, 63 per step beside the running sequence's decode row.
  expect(steps).toBe(Math.ceil(500 / 63));
});

test.each(KINDS.flatMap((kind) => [false, true].map((tensorSampler) => [kind, tensorSampler] as const)))(
  'several decode steps per call give the same tokens as one per call, stops included (%s, tensor sampler: %s)',
  async (kind, tensorSampler) => {
    const rng = new Rng(19);
    const prompts = [3, 8, 12, 20].map((n) => randomTokens(rng, n, cfg.vocabSize));
    const requests: GenerationRequest[] = prompts.map((p, i) => ({
      promptIds: p,
      maxTokens: 17 + 5 * i,
      temperature: i === 0 ? 0 : 1,
      topK: i === 2 ? 20 : -1,
      seed: i,
      topLogprobs: i === 3 ? 2 : 0,
    }));
    const single = await serve(big({ tensorSampler }), requests);
    // A stop token each sequence meets part-way: a multi-step call drops what follows it.
    const stopping = requests.map((r, i) => ({ ...r, stopTokenIds: [single[i].tokens[9]] }));
    for (const reqs of [requests, stopping]) {
      const one = await serve(big({ tensorSampler }), reqs);
      const gen = generatorOf(kind, model, { maxSequences: 16, maxSequenceLength: 256, tensorSampler });
      const several = await serve(gen, reqs, { maxSteps: 6 });
      expectSame(several, one);
      expect(gen.stats().blocksInUse).toBe(0);
      // The next turns (prompt, reply, more) from the cache: a call's steps past a stop token went
      // into the cache (hybrid: the state) and must not be taken for the reply's.
      const next = reqs.map((r, i) => ({
        ...r,
        promptIds: [...r.promptIds, ...several[i].tokens, 5, 6],
        stopTokenIds: [],
      }));
      expectSame(await serve(gen, next), await serve(big({ tensorSampler }), next));
      expect(gen.stats().prefixHitTokens).toBeGreaterThan(0);
    }
  },
);

describe.each(KINDS)('the block pool (%s)', (kind) => {
  test.each(['off', 'live', 'cache'] as const)(
    'never leaks: a storm of requests, shared prompts, next turns, cancellations, stops, preemptions and weight updates (%s)',
    async (prefixSharing) => {
      const rng = new Rng(prefixSharing.length);
      const m = await loadModel(cfg, randomWeights(cfg, 50));
      const weights = [randomWeights(cfg, 51), randomWeights(cfg, 52)];
      const gen = generatorOf(kind, m, {
        maxSequences: 6,
        maxSequenceLength: 80,
        kvCacheTokens: 96,
        blockSize: 4,
        maxBatchedTokens: 24,
        prefixSharing,
        tensorSampler: rng.uniform() < 0.5,
      });
      const shared = randomTokens(rng, 30, cfg.vocabSize);
      let live: number[] = [];
      let preemptedSeen = 0;
      // Each live sequence's tokens; finished ones' whole histories, which later prompts continue
      // (the next turn of a multi-turn rollout).
      const tokensOf = new Map<number, number[]>();
      const histories: number[][] = [];
      for (let round = 0; round < 120; round++) {
        const r = rng.uniform();
        if (r < 0.35) {
          const reqs = Array.from({ length: 1 + Math.floor(rng.uniform() * 4) }, () => {
            const own = randomTokens(rng, 1 + Math.floor(rng.uniform() * 20), cfg.vocabSize);
            const pick = rng.uniform();
            let head: number[] = [];
            if (pick < 0.4) head = shared.slice(0, 4 + Math.floor(rng.uniform() * 26));
            else if (pick < 0.6 && histories.length > 0) head = histories[Math.floor(rng.uniform() * histories.length)];
            const prompt = [...head, ...own];
            return {
              promptIds: prompt.slice(0, 55),
              maxTokens: 5 + Math.floor(rng.uniform() * 30),
              temperature: rng.uniform() < 0.3 ? 0 : 1,
              seed: round,
              stopTokenIds: rng.uniform() < 0.3 ? [Math.floor(rng.uniform() * cfg.vocabSize)] : [],
            };
          });
          (await gen.add(reqs)).forEach((a, i) => {
            live.push(a.seqId);
            tokensOf.set(a.seqId, [...reqs[i].promptIds]);
          });
        } else if (r < 0.5 && live.length > 0) {
          const gone = live.filter(() => rng.uniform() < 0.4); // cancellations, disconnects
          await gen.remove(gone);
          live = live.filter((id) => !gone.includes(id));
        } else if (r < 0.53) {
          await m.loadWeights(weights[round % 2]);
        } else {
          for (const t of await gen.step(1 + Math.floor(rng.uniform() * 3))) {
            const tokens = tokensOf.get(t.seqId)!;
            if (t.token >= 0) tokens.push(t.token);
            if (!t.finished) continue;
            live = live.filter((id) => id !== t.seqId);
            if (tokens.length < 50) histories.push(tokens);
          }
        }
        const s = gen.stats();
        preemptedSeen += s.preemptedSequences;
        expect(s.blocksInUse).toBeLessThanOrEqual(s.numBlocks);
        expect(s.runningSequences).toBeLessThanOrEqual(6);
        expect(s.activeSequences).toBe(live.length);
        if (s.state) expect(s.state.inUse).toBe(s.runningSequences); // a slot each, none leaked
      }
      while (gen.stats().activeSequences > 0) await gen.step();
      expect(gen.stats()).toMatchObject({ activeSequences: 0, blocksInUse: 0 });
      expect(gen.stats().state?.inUse ?? 0).toBe(0);
      expect(gen.stats().preemptions).toBeGreaterThan(0);
      expect(preemptedSeen).toBeGreaterThan(0);
      if (prefixSharing !== 'off') expect(gen.stats().prefixHitTokens).toBeGreaterThan(0);
      // Every block is free or parked: one sequence can take them all.
      const all = randomTokens(rng, 80, cfg.vocabSize);
      expect(await gen.add([{ promptIds: all, maxTokens: 1 }])).toHaveLength(1);
      expect(gen.stats().blocksInUse).toBe(20); // 80 positions in blocks of 4
      while (gen.stats().activeSequences > 0) await gen.step();
      expect(gen.stats().blocksInUse).toBe(0);
    },
  );

  test('admission fuzzed with random prompt and answer lengths: every sequence as if it ran alone', async () => {
    const rng = new Rng(77);
    for (let round = 0; round < 3; round++) {
      const blockSize = [1, 3, 8, 16][round % 4];
      const maxSequenceLength = 64;
      const requests: GenerationRequest[] = Array.from({ length: 14 }, (_, i) => {
        const promptLength = 1 + Math.floor(rng.uniform() * 50);
        return {
          promptIds: randomTokens(rng, promptLength, cfg.vocabSize),
          maxTokens: 1 + Math.floor(rng.uniform() * 40),
          temperature: 1,
          seed: round * 100 + i,
        };
      });
      const gen = generatorOf(kind, model, {
        maxSequences: 1 + Math.floor(rng.uniform() * 8),
        maxSequenceLength,
        kvCacheTokens: maxSequenceLength + Math.floor(rng.uniform() * 200),
        blockSize,
        maxBatchedTokens: 8 + Math.floor(rng.uniform() * 40),
        prefixSharing: (['off', 'live', 'cache'] as const)[round % 3],
      });
      const res = await serve(gen, requests);
      const alone = await serve(big({ maxSequenceLength }), requests);
      expectSame(res, alone, 1e-4);
      requests.forEach((r, i) =>
        expect(res[i].tokens.length).toBe(Math.min(r.maxTokens!, maxSequenceLength - r.promptIds.length + 1)),
      );
      expect(gen.stats()).toMatchObject({ activeSequences: 0, blocksInUse: 0 });
    }
  });
});

/**
 * The CUDA paged decode kernel's blocks, planned on the host (native/src/paged_decode_plan.h): every
 * model shape we ship and every size of the families we load fits the default 256-position
 * partition in the 48 KiB of shared memory every device gives, up to its longest context; a shape
 * that does not is opted in where the device allows more, served with smaller partitions where it
 * does not, and refused by name (at the generator's creation) where even those do not fit.
 */
describe("the paged decode kernel's shared memory", () => {
  // The configs/models presets, the benchmark shapes, model create's presets, and the families'
  // published sizes: [name, query heads, kv heads, head size, longest context].
  type Shape = [string, number, number, number, number];
  const of = (
    name: string,
    c: { numHeads: number; numKvHeads: number; headDim: number; maxPositionEmbeddings: number },
  ): Shape => [name, c.numHeads, c.numKvHeads, c.headDim, c.maxPositionEmbeddings];
  const models = path.join(projectRoot, 'configs', 'models');
  const shapes: Shape[] = [
    ...fs.readdirSync(models).map((n) => of(n, readHfConfigShape(path.join(models, n)).config)),
    ...Object.entries(MODEL_PRESETS).map(([n, p]) =>
      of(`model create --preset ${n}`, { ...p, headDim: p.hiddenSize / p.numHeads }),
    ),
    ...Object.entries({ QWEN3_0_6B, QWEN3_1_7B }).map(([n, s]) => of(`bench ${n}`, s as Parameters<typeof of>[1])),
    ['Llama 3.2 1B', 32, 8, 64, 131072],
    ['Llama 3.2 3B', 24, 8, 128, 131072],
    ['Llama 3.1 8B', 32, 8, 128, 131072],
    ['Llama 3.1 70B', 64, 8, 128, 131072],
    ['Llama 3.1 405B', 128, 8, 128, 131072],
    ['Qwen2.5 0.5B', 14, 2, 64, 32768],
    ['Qwen2.5 1.5B', 12, 2, 128, 131072],
    ['Qwen2.5 3B', 16, 2, 128, 32768],
    ['Qwen2.5 7B', 28, 4, 128, 131072],
    ['Qwen2.5 14B', 40, 8, 128, 131072],
    ['Qwen2.5 72B', 64, 8, 128, 131072],
    ['Qwen3 4B', 32, 8, 128, 40960],
    ['Qwen3 14B', 40, 8, 128, 40960],
    ['Qwen3 30B-A3B', 32, 4, 128, 40960],
    ['Qwen3 235B-A22B', 64, 4, 128, 40960],
  ];
  test.each(shapes)(
    '%s: %i query heads over %i kv heads of %i, %i positions',
    (_n, heads, kvHeads, headDim, maxKeys) => {
      const plan = pagedDecodePlan({ heads, kvHeads, headDim, maxKeys });
      expect(plan).toEqual({ partition: 256, sharedBytes: expect.any(Number), optIn: false, why: '' });
      expect(plan.sharedBytes).toBeLessThanOrEqual(48 * 1024);
    },
  );
  test('a shape beyond 48 KiB is opted in where the device allows, else served with smaller partitions', () => {
    const wide = { heads: 64, kvHeads: 2, headDim: 256, maxKeys: 8192 }; // 32 query heads per kv head
    expect(pagedDecodePlan({ ...wide, optInLimit: 227 * 1024 })).toMatchObject({
      partition: 256,
      optIn: true,
      why: '',
    });
    const small = pagedDecodePlan(wide);
    expect(small.partition).toBeLessThan(256);
    expect(small.partition % 32).toBe(0);
    expect(small.sharedBytes).toBeLessThanOrEqual(48 * 1024);
    expect(small.optIn).toBe(false);
  });
  test('what no partition fits is refused, saying why', () => {
    expect(pagedDecodePlan({ heads: 512, kvHeads: 1, headDim: 512, maxKeys: 1024 }).why).toMatch(
      /512 query heads per kv head of size 512 need \d+ bytes of shared memory per block even with 32-position partitions; the device allows 49152/,
    );
    expect(pagedDecodePlan({ heads: 6, kvHeads: 4, headDim: 64, maxKeys: 1024 }).why).toMatch(
      /query heads a multiple of kv heads \(6 over 4\)/,
    );
    expect(pagedDecodePlan({ heads: 8, kvHeads: 8, headDim: 64, maxKeys: 1 << 20 }).why).toMatch(
      /contexts of 1048576 positions are outside what the kernel takes/,
    );
  });
});
