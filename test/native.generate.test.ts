/** Native generation: KV-cache decode vs full forward, sampling determinism, continuous batching. */
import {
  isEngineOptionError,
  setThreads,
  type EngineOptionError,
  type GenerationRequest,
  type Generator,
  type GeneratorOptions,
  type NativeModel,
  type StepToken,
} from '../native';
import { loadModel } from '../lib/model/engine';
import { packRow, randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';

setThreads(2);

interface Done {
  tokens: number[];
  logprobs: number[];
  finishReason?: string;
  promptLogprobs?: Float32Array;
}

/** Adds the requests (all must fit at once) and steps until all of them finish. */
async function generate(gen: Generator, requests: GenerationRequest[]): Promise<Done[]> {
  const added = await gen.add(requests);
  expect(added.length).toBe(requests.length);
  const out = new Map<number, Done>(added.map((a) => [a.seqId, { tokens: [], logprobs: [] }]));
  while (gen.stats().activeSequences > 0) {
    for (const t of await gen.step()) {
      const d = out.get(t.seqId)!;
      if (t.first) d.promptLogprobs = t.promptLogprobs;
      d.tokens.push(t.token);
      d.logprobs.push(t.logprob);
      if (t.finished) d.finishReason = t.finishReason;
    }
  }
  return added.map((a) => out.get(a.seqId)!);
}

const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
};

describe.each(['llama', 'qwen2', 'qwen3', 'qwen3_moe'] as const)('%s', (arch) => {
  const cfg = tinyConfig(arch);
  let model: NativeModel;
  beforeAll(async () => {
    model = await loadModel(cfg, randomWeights(cfg, 11));
  });

  test('KV-cache decode logprobs equal a full forward (batched, different lengths)', async () => {
    const rng = new Rng(3);
    const prompts = [1, 4, 9, 23].map((n) => randomTokens(rng, n, cfg.vocabSize));
    for (const temperature of [1, 0.6]) {
      const gen = model.createGenerator({ maxSequences: 8, maxSequenceLength: 64 });
      const res = await generate(
        gen,
        prompts.map((p, i) => ({ promptIds: p, temperature, maxTokens: 12 + i, seed: i, promptLogprobs: true })),
      );
      const full = await model.score(
        prompts.map((p, i) => packRow([[...p, ...res[i].tokens]])),
        { temperature },
      );
      prompts.forEach((p, i) => {
        expect(res[i].finishReason).toBe('length');
        expect(res[i].tokens.length).toBe(12 + i);
        expect(maxAbsDiff(res[i].logprobs, full[i].logprobs.slice(p.length))).toBeLessThanOrEqual(1e-5);
      });
    }
  });

  test('bf16: KV-cache decode (batched matmuls over the cache, as on CUDA) is as close to fp32 as a bf16 forward', async () => {
    // bf16 rounds every product: neither path is near fp32 token by token, and which tokens are
    // sampled (hence scored) moves with any rounding that flips. One model's ~40 tokens made the
    // bound a single outlier's (decode's max error 0.066 against the forward's 0.037 or 0.025 as
    // the third row sampled other tokens; docs/benchmarks/compare.md): the errors of four models
    // pooled. Decoding must be no worse than the bf16 forward (mean and max error against fp32),
    // with a floor for tiny ones.
    const decoded: number[] = [],
      forward: number[] = [],
      exact: number[] = [];
    for (const seed of [11, 111, 211, 311]) {
      const weights = randomWeights(cfg, seed);
      const fp32 = seed === 11 ? model : await loadModel(cfg, weights);
      const bf16 = await loadModel(cfg, weights, { dtype: 'bfloat16' });
      const rng = new Rng(4 + seed);
      const prompts = [2, 5, 17].map((n) => randomTokens(rng, n, cfg.vocabSize));
      const res = await generate(
        bf16.createGenerator({ maxSequences: 4, maxSequenceLength: 64 }),
        prompts.map((p, i) => ({ promptIds: p, maxTokens: 10 + 3 * i, seed: i })),
      );
      const rows = prompts.map((p, i) => packRow([[...p, ...res[i].tokens]]));
      const generated = (scores: { logprobs: Float32Array }[]) =>
        scores.flatMap((s, i) => Array.from(s.logprobs.slice(prompts[i].length)));
      exact.push(...generated(await fp32.score(rows))); // fp32, the same weights
      forward.push(...generated(await bf16.score(rows)));
      decoded.push(...res.flatMap((r) => r.logprobs));
    }
    const mean = (a: number[]) => a.reduce((x, y) => x + Math.abs(y), 0) / a.length;
    const err = (a: number[]) => a.map((v, i) => v - exact[i]);
    expect(mean(err(decoded))).toBeLessThanOrEqual(2 * mean(err(forward)) + 1e-3);
    expect(maxAbsDiff(decoded, exact)).toBeLessThanOrEqual(2 * maxAbsDiff(forward, exact) + 1e-3);
  });
});

describe('sampling and batching', () => {
  const cfg = tinyConfig('qwen3');
  let model: NativeModel;
  const prompt = [5, 17, 42, 99, 7];
  beforeAll(async () => {
    model = await loadModel(cfg, randomWeights(cfg, 12));
  });
  const run = async (reqs: GenerationRequest[]) =>
    generate(model.createGenerator({ maxSequences: 64, maxSequenceLength: 128 }), reqs);

  test('prompt logprobs equal scoring the prompt (temperature 1, NaN first)', async () => {
    const gen = model.createGenerator({ maxSequences: 2, maxSequenceLength: 32 });
    const [done] = await generate(gen, [{ promptIds: prompt, promptLogprobs: true, temperature: 0.5, maxTokens: 2 }]);
    const [scored] = await model.score([packRow([prompt])]);
    expect(Number.isNaN(done.promptLogprobs![0])).toBe(true);
    expect(maxAbsDiff(done.promptLogprobs!.slice(1), scored.logprobs.slice(1))).toBeLessThanOrEqual(1e-5);
  });

  test('long prompts admitted together are prefilled in chunks of the step budget (2048 tokens) and split right', async () => {
    // 1801 + 1 + 2501 + 901 prompt tokens: chunks of up to 2048 per step (beside the decode rows of
    // the prompts done first) cut prompts 0 and 2 across steps.
    const rng = new Rng(21);
    const prompts = [1801, 1, 2501, 901].map((n) => randomTokens(rng, n, cfg.vocabSize));
    const gen = model.createGenerator({ maxSequences: 4, maxSequenceLength: 2600 });
    const done = await generate(
      gen,
      prompts.map((p, i) => ({ promptIds: p, promptLogprobs: true, seed: i, maxTokens: 1 })),
    );
    const scored = await model.score(prompts.map((p) => packRow([p])));
    prompts.forEach((p, i) => {
      expect(done[i].promptLogprobs!.length).toBe(p.length);
      expect(maxAbsDiff(done[i].promptLogprobs!.slice(1), scored[i].logprobs.slice(1))).toBeLessThanOrEqual(1e-4);
    });
    // Each sequence's blocks hold its own prompt: its first token's logprob equals a full forward.
    const full = await model.score(prompts.map((p, i) => packRow([[...p, done[i].tokens[0]]])));
    prompts.forEach((p, i) =>
      expect(Math.abs(done[i].logprobs[0] - full[i].logprobs[p.length])).toBeLessThanOrEqual(1e-4),
    );
    expect(gen.stats().prefillTokens).toBe(1801 + 1 + 2501 + 901);
  });

  test('same seed same tokens, different seeds differ, top_k=1 equals greedy', async () => {
    const base = { promptIds: prompt, maxTokens: 24, temperature: 1.2 };
    const [a, b, c] = await run([
      { ...base, seed: 1 },
      { ...base, seed: 1 },
      { ...base, seed: 2 },
    ]);
    expect(a.tokens).toEqual(b.tokens);
    expect(a.tokens).not.toEqual(c.tokens);
    // A temperature whose inverse overflows fp32 (and fp64) samples the maximum with logprob 0.
    const [greedy, topk1, greedy2, cold, colder] = await run([
      { ...base, temperature: 0 },
      { ...base, topK: 1, seed: 5 },
      { ...base, temperature: 0, promptIds: [...prompt] },
      { ...base, temperature: 1e-40, seed: 6 },
      { ...base, temperature: 5e-324, seed: 7 },
    ]);
    expect(topk1.tokens).toEqual(greedy.tokens);
    expect(greedy2.tokens).toEqual(greedy.tokens);
    for (const r of [cold, colder])
      expect({ tokens: r.tokens, logprobs: r.logprobs }).toEqual({
        tokens: greedy.tokens,
        logprobs: greedy.tokens.map(() => 0),
      });
    // Greedy reports the raw (temperature 1) logprob; top-k=1 at T=1.2 reports its own T.
    const [scored] = await model.score([packRow([[...prompt, ...greedy.tokens]])]);
    expect(maxAbsDiff(greedy.logprobs, scored.logprobs.slice(prompt.length))).toBeLessThanOrEqual(1e-5);
  });

  test('top_p, min_p and top_k restrict the sampled tokens', async () => {
    const base = { promptIds: prompt, maxTokens: 1, temperature: 1 };
    // With a tiny top_p only the most likely token survives: it equals greedy.
    const [greedy] = await run([{ ...base, temperature: 0 }]);
    const seeds = Array.from({ length: 8 }, (_, i) => i);
    const tiny = await run(seeds.map((seed) => ({ ...base, topP: 1e-6, seed })));
    const minp = await run(seeds.map((seed) => ({ ...base, minP: 1, seed })));
    for (const r of [...tiny, ...minp]) expect(r.tokens).toEqual(greedy.tokens);
    const top3 = await run(Array.from({ length: 40 }, (_, seed) => ({ ...base, topK: 3, seed })));
    expect(new Set(top3.map((r) => r.tokens[0])).size).toBeLessThanOrEqual(3);
    const free = await run(Array.from({ length: 40 }, (_, seed) => ({ ...base, seed, temperature: 3 })));
    expect(new Set(free.map((r) => r.tokens[0])).size).toBeGreaterThan(3);
  });

  test('top logprobs: the k best of the sampled-token distribution, sorted, equal to a full forward', async () => {
    const k = 5;
    const gen = model.createGenerator({ maxSequences: 4, maxSequenceLength: 64 });
    const reqs: GenerationRequest[] = [
      { promptIds: prompt, maxTokens: 3, temperature: 0, topLogprobs: k },
      { promptIds: prompt, maxTokens: 3, temperature: 0.7, seed: 4, topLogprobs: k },
      { promptIds: prompt, maxTokens: 3, temperature: 0.7, seed: 4 },
    ];
    const added = await gen.add(reqs);
    const steps: StepToken[][] = [[], [], []];
    while (gen.stats().activeSequences > 0)
      for (const t of await gen.step()) steps[added.findIndex((a) => a.seqId === t.seqId)].push(t);
    expect(steps[2].every((t) => t.topLogprobs === undefined)).toBe(true); // only when asked
    expect(steps[2].map((t) => t.token)).toEqual(steps[1].map((t) => t.token));
    for (const [r, temperature] of [
      [0, 1],
      [1, 0.7],
    ] as const) {
      const tokens = steps[r].map((t) => t.token);
      for (const s of [0, 2]) {
        const top = steps[r][s].topLogprobs!;
        expect(top.ids.constructor.name).toBe('Int32Array'); // (a native realm's Int32Array: no instanceof)
        expect(top.ids.length).toBe(k);
        // The full distribution at this step: score every candidate as the next token.
        const context = [...prompt, ...tokens.slice(0, s)];
        const all = await model.score(
          Array.from({ length: cfg.vocabSize }, (_, v) => packRow([[...context, v]])),
          { temperature },
        );
        const full = all.map((x) => x.logprobs[context.length]);
        const best = Array.from(full.keys())
          .sort((a, b) => full[b] - full[a] || a - b)
          .slice(0, k);
        expect(Array.from(top.ids)).toEqual(best);
        top.logprobs.forEach((lp, j) => expect(Math.abs(lp - full[best[j]])).toBeLessThanOrEqual(1e-5));
        for (let j = 1; j < k; j++) expect(top.logprobs[j]).toBeLessThanOrEqual(top.logprobs[j - 1]);
        if (r === 0) {
          // Greedy: the sampled token is the argmax, first in the list with the same logprob.
          expect(top.ids[0]).toBe(steps[r][s].token);
          expect(top.logprobs[0]).toBe(steps[r][s].logprob);
        } else {
          const at = Array.from(top.ids).indexOf(steps[r][s].token);
          if (at >= 0) expect(top.logprobs[at]).toBe(steps[r][s].logprob);
        }
      }
    }
    await expect(gen.add([{ promptIds: prompt, topLogprobs: 21 }])).rejects.toThrow(/topLogprobs must be in \[0, 20\]/);
  });

  test('sequences joining and leaving do not change the others', async () => {
    const a: GenerationRequest = { promptIds: prompt, maxTokens: 30, temperature: 1, seed: 77 };
    const [alone] = await run([a]);
    const gen = model.createGenerator({ maxSequences: 4, maxSequenceLength: 128 });
    const [{ seqId: idA }] = await gen.add([a]);
    const tokens: number[] = [];
    let others: number[] = [];
    for (let step = 0; tokens.length < 30; step++) {
      if (step === 3)
        others = (
          await gen.add([
            { promptIds: [1, 2, 3], maxTokens: 100, seed: 1 },
            { promptIds: randomTokens(new Rng(9), 40, 300), maxTokens: 4 },
          ])
        ).map((s) => s.seqId);
      if (step === 10) expect(await gen.remove([others[0], 12345])).toEqual([true, false]);
      if (step === 12) await gen.add([{ promptIds: [9, 9, 9, 9, 9, 9, 9], maxTokens: 50, temperature: 0 }]);
      for (const t of await gen.step()) if (t.seqId === idA) tokens.push(t.token);
    }
    expect(tokens).toEqual(alone.tokens);
    expect(gen.stats().activeSequences).toBe(1); // the greedy one added at step 12
  });

  test('stop tokens, max tokens, cache limit and stats', async () => {
    const [free] = await run([{ promptIds: prompt, maxTokens: 10, temperature: 0 }]);
    const stopAt = free.tokens[4];
    const [stopped] = await run([{ promptIds: prompt, maxTokens: 10, temperature: 0, stopTokenIds: [stopAt] }]);
    expect(stopped.finishReason).toBe('stop');
    expect(stopped.tokens).toEqual(free.tokens.slice(0, free.tokens.indexOf(stopAt) + 1));
    const small = model.createGenerator({ maxSequences: 2, maxSequenceLength: 8 });
    const [full] = await generate(small, [{ promptIds: prompt, maxTokens: 100, temperature: 0 }]);
    expect(full.finishReason).toBe('length');
    expect(prompt.length + full.tokens.length).toBe(8 + 1); // the last sampled token is not cached
    await small.add([{ promptIds: [1, 2, 3] }]);
    // 2 x 8 positions: one block of 16, taken by the prompt (prefilled by the next step).
    expect(small.stats()).toEqual({
      activeSequences: 1,
      runningSequences: 1,
      preemptedSequences: 0,
      cachedTokens: 0,
      maxSequences: 2,
      maxSequenceLength: 8,
      blockSize: 16,
      numBlocks: 1,
      capacityTokens: 16,
      blocksInUse: 1,
      blocksCached: 0,
      cacheUsage: 1,
      preemptions: 0,
      prefillTokens: 5, // the earlier sequence's prompt
      prefixHitTokens: 0,
      cudaGraphs: 0,
      eagerReason: expect.stringMatching(/no CUDA|not on a CUDA device/),
      times: expect.objectContaining({ calls: 4, steps: 4, device: 0 }), // the prefill, 3 decode steps
    });
    await small.step();
    expect(small.stats()).toMatchObject({ cachedTokens: 3, prefillTokens: 5 + 3 });
    const eager = model.createGenerator({ maxSequences: 1, maxSequenceLength: 8, cudaGraphs: false });
    expect(eager.stats().eagerReason).toBe('CUDA graphs are off for this generator');
  });

  test.each([false, true])(
    'non-finite logits end a sequence with an error, and leave no NaN in the cache (tensor sampler: %s)',
    async (tensorSampler) => {
      const good = randomWeights(cfg, 13);
      const nan = good.map((t) => ({ ...t, data: Buffer.from(new Float32Array(t.data.length / 4).fill(NaN).buffer) }));
      // bfloat16: decode attention runs as batched matmuls, which multiply masked cache entries by 0
      // (0 x NaN = NaN), as on CUDA.
      const m = await loadModel(cfg, nan, { dtype: 'bfloat16' });
      const gen = m.createGenerator({ maxSequences: 2, maxSequenceLength: 64, tensorSampler });
      const long = (n: number) => Array.from({ length: n }, (_, i) => 1 + i);
      for (const sampling of [{ temperature: 0 }, { temperature: 1 }, { topP: 0.9 }, { topK: 5 }, { minP: 0.1 }]) {
        await gen.add([
          { promptIds: long(40), ...sampling, topLogprobs: 3 },
          { promptIds: long(40), ...sampling },
        ]);
        const tokens = await gen.step();
        expect(tokens.map((t) => [t.token, t.finished, t.finishReason])).toEqual([
          [-1, true, 'error'],
          [-1, true, 'error'],
        ]);
        expect(tokens[0].error).toMatch(/non-finite logits/);
        expect(gen.stats().activeSequences).toBe(0);
      }
      // Also sequences removed before their first step (a client gone right after prefill).
      const added = await gen.add([{ promptIds: long(50) }, { promptIds: long(50) }]);
      await gen.remove(added.map((a) => a.seqId));
      // Good weights: a short and a long sequence together decode as on a fresh cache.
      await m.loadWeights(good);
      const requests = [
        { promptIds: [1, 2, 3], temperature: 0, maxTokens: 6 },
        { promptIds: long(30), temperature: 0, maxTokens: 6 },
      ];
      const reused = await generate(gen, requests);
      const fresh = await generate(
        m.createGenerator({ maxSequences: 2, maxSequenceLength: 64, tensorSampler }),
        requests,
      );
      expect(reused.map((r) => r.finishReason)).toEqual(['length', 'length']);
      expect(reused).toEqual(fresh);
    },
  );

  test("the tensor-op sampler (the CUDA path) gives the host sampler's tokens, logprobs and top logprobs", async () => {
    // A wider vocabulary than the tiny preset's, so filters cut real distributions.
    const wide = tinyConfig('qwen3', { vocabSize: 1024 });
    const m = await loadModel(wide, randomWeights(wide, 21));
    const rng = new Rng(4);
    const samplings: Partial<GenerationRequest>[] = [
      { temperature: 0, topLogprobs: 3 },
      { temperature: 1 },
      { temperature: 0.7, topK: 5 },
      { temperature: 1, topP: 0.9, topLogprobs: 5 },
      { temperature: 1.2, minP: 0.05 },
      { temperature: 1, topK: 40, topP: 0.8, minP: 0.01 },
      { temperature: 1.5, topK: 3, topLogprobs: 2 },
      { temperature: 0.9, topP: 0.5, minP: 0.2 },
      { temperature: 2, topK: 1000, topP: 0.99 },
    ];
    const requests: GenerationRequest[] = samplings.map((s, i) => ({
      promptIds: randomTokens(rng, 3 + i, wide.vocabSize),
      maxTokens: 20,
      seed: 100 + i,
      ...s,
    }));
    const steps = async (tensorSampler: boolean, reqs: GenerationRequest[]) => {
      const gen = m.createGenerator({ maxSequences: 16, maxSequenceLength: 64, tensorSampler });
      const added = await gen.add(reqs);
      const out = added.map(() => [] as StepToken[]);
      while (gen.stats().activeSequences > 0)
        for (const t of await gen.step()) out[added.findIndex((a) => a.seqId === t.seqId)].push(t);
      return out;
    };
    const host = await steps(false, requests);
    const tensor = await steps(true, requests);
    requests.forEach((_, i) => {
      expect(tensor[i].map((t) => t.token)).toEqual(host[i].map((t) => t.token));
      expect(
        maxAbsDiff(
          tensor[i].map((t) => t.logprob),
          host[i].map((t) => t.logprob),
        ),
      ).toBeLessThanOrEqual(1e-5);
      tensor[i].forEach((t, j) => {
        const h = host[i][j].topLogprobs;
        if (!h) return expect(t.topLogprobs).toBeUndefined();
        expect(Array.from(t.topLogprobs!.ids)).toEqual(Array.from(h.ids));
        expect(maxAbsDiff(t.topLogprobs!.logprobs, h.logprobs)).toBeLessThanOrEqual(1e-5);
      });
    });
    // Not one sampling setting that always gives the same token: the filters' paths were exercised.
    expect(new Set(tensor.flatMap((s) => s.map((t) => t.token))).size).toBeGreaterThan(50);
    // A sequence's tokens do not depend on the rest of the batch.
    const [alone] = await steps(true, [requests[5]]);
    expect(alone.map((t) => t.token)).toEqual(tensor[5].map((t) => t.token));
    // Ties (all-zero weights: every logit 0) come lower id first on both paths.
    const flat = await loadModel(
      wide,
      randomWeights(wide, 1).map((t) => ({ ...t, data: Buffer.alloc(t.data.length) })),
    );
    for (const tensorSampler of [false, true]) {
      const gen = flat.createGenerator({ maxSequences: 2, maxSequenceLength: 16, tensorSampler });
      await gen.add([{ promptIds: [3, 4], maxTokens: 1, temperature: 0, topLogprobs: 4 }]);
      const [t] = await gen.step();
      expect(t.token).toBe(0);
      expect(Array.from(t.topLogprobs!.ids)).toEqual([0, 1, 2, 3]);
      expect(t.logprob).toBeCloseTo(-Math.log(wide.vocabSize), 5);
    }
  });

  describe('penalties, logit bias and min_tokens (OpenAI and vLLM semantics)', () => {
    // All-zero weights: every logit 0, so what the adjustments make of a row is computed by hand.
    const wide = tinyConfig('qwen3', { vocabSize: 1024 });
    const V = wide.vocabSize;
    let flat: NativeModel;
    let m: NativeModel;
    beforeAll(async () => {
      flat = await loadModel(
        wide,
        randomWeights(wide, 1).map((t) => ({ ...t, data: Buffer.alloc(t.data.length) })),
      );
      m = await loadModel(wide, randomWeights(wide, 21));
    });
    const lse = (xs: number[]) => Math.log(xs.reduce((a, x) => a + Math.exp(x), 0));
    /** The greedy tokens and logprobs of `req` on the flat model, per sampler and steps per call. */
    const flatRuns = async (req: GenerationRequest) => {
      const out = [];
      for (const tensorSampler of [false, true])
        for (const steps of [1, 4]) {
          const gen = flat.createGenerator({ maxSequences: 2, maxSequenceLength: 64, tensorSampler });
          const [{ seqId }] = await gen.add([req]);
          const done: StepToken[] = [];
          while (gen.stats().activeSequences > 0)
            done.push(...(await gen.step(steps)).filter((t) => t.seqId === seqId));
          out.push(done);
        }
      return out;
    };

    test('greedy with a logit bias and both penalties: the hand-computed tokens and logprobs, on both samplers', async () => {
      // Token 5 starts at bias 2 and loses 0.25 (frequency) per time sampled, 0.5 (presence) once:
      // 2, 1.25, 1, 0.75, 0.5, 0.25, then 0 ties every other logit, and the first maximum, token 0,
      // wins; each token sampled then sits at -0.75, so tokens 1, 2, 3 follow.
      const req: GenerationRequest = {
        promptIds: [3, 4],
        maxTokens: 10,
        temperature: 0,
        logitBias: { tokenIds: [5], biases: [2] },
        presencePenalty: 0.5,
        frequencyPenalty: 0.25,
      };
      const x5 = [2, 1.25, 1, 0.75, 0.5, 0.25];
      const expected = {
        tokens: [5, 5, 5, 5, 5, 5, 0, 1, 2, 3],
        logprobs: [
          ...x5.map((x) => x - Math.log(Math.exp(x) + (V - 1))),
          -Math.log(V), // step 6: token 5 back at 0 with all the others
          -Math.log(V - 1 + Math.exp(-0.75)), // token 0 at -0.75
          -Math.log(V - 2 + 2 * Math.exp(-0.75)),
          -Math.log(V - 3 + 3 * Math.exp(-0.75)),
        ],
      };
      for (const run of await flatRuns(req)) {
        expect(run.map((t) => t.token)).toEqual(expected.tokens);
        expect(
          maxAbsDiff(
            run.map((t) => t.logprob),
            expected.logprobs,
          ),
        ).toBeLessThanOrEqual(1e-5);
      }
    });

    test('min_tokens holds the stop tokens back, then they stop the sequence; sampled rows report the adjusted distribution', async () => {
      // Token 7 (a stop token, bias 3) is banned (-inf) for the first 3 tokens: 0 wins the tie.
      const req: GenerationRequest = {
        promptIds: [3, 4],
        maxTokens: 10,
        temperature: 0,
        stopTokenIds: [7],
        minTokens: 3,
        logitBias: { tokenIds: [7], biases: [3] },
        topLogprobs: 2,
      };
      for (const run of await flatRuns(req)) {
        expect(run.map((t) => [t.token, t.finishReason])).toEqual([
          [0, undefined],
          [0, undefined],
          [0, undefined],
          [7, 'stop'],
        ]);
        const lps = [-Math.log(V - 1), -Math.log(V - 1), -Math.log(V - 1), 3 - Math.log(Math.exp(3) + V - 1)];
        expect(
          maxAbsDiff(
            run.map((t) => t.logprob),
            lps,
          ),
        ).toBeLessThanOrEqual(1e-5);
        expect(Array.from(run[3].topLogprobs!.ids)).toEqual([7, 0]);
        expect(Array.from(run[0].topLogprobs!.ids)).toEqual([0, 1]); // 7 is not a candidate while banned
      }
      // Sampled at temperature 0.5 with penalties: each token's logprob is log softmax((x - penalties) / T)
      // of the flat row, the penalties from the tokens before it, computed by hand.
      const T = 0.5;
      const sampledReq: GenerationRequest = {
        promptIds: [3, 4],
        maxTokens: 30,
        temperature: T,
        seed: 9,
        presencePenalty: 1.5,
        frequencyPenalty: -0.5, // a negative penalty rewards repeats
        logitBias: { tokenIds: [11, 12], biases: [4, -100] },
      };
      for (const run of await flatRuns(sampledReq)) {
        const counts = new Map<number, number>();
        run.forEach((t) => {
          const x = Array.from({ length: V }, (_, v) => {
            const c = counts.get(v) ?? 0;
            return (({ 11: 4, 12: -100 } as Record<number, number>)[v] ?? 0) + (c > 0 ? -(-0.5 * c + 1.5) : 0);
          });
          expect(Math.abs(t.logprob - (x[t.token] / T - lse(x.map((v) => v / T))))).toBeLessThanOrEqual(1e-4);
          counts.set(t.token, (counts.get(t.token) ?? 0) + 1);
        });
        expect(run.map((t) => t.token)).not.toContain(12);
      }
      const runs = await flatRuns(sampledReq);
      for (const r of runs.slice(1)) expect(r.map((t) => t.token)).toEqual(runs[0].map((t) => t.token));
    });

    test("on a real model: the tensor sampler's tokens and logprobs are the host sampler's, one step or four per call", async () => {
      const rng = new Rng(8);
      const settings: Partial<GenerationRequest>[] = [
        { temperature: 1, presencePenalty: 1.2 },
        { temperature: 0.8, frequencyPenalty: 0.7, topK: 40 },
        { temperature: 0, presencePenalty: 0.4, frequencyPenalty: 0.4, topLogprobs: 3 },
        { temperature: 1.1, topP: 0.9, logitBias: { tokenIds: [1, 2, 3], biases: [5, -5, 2] } },
        { temperature: 1, minP: 0.05, minTokens: 6, stopTokenIds: [0, 1, 2, 3, 4, 5] },
        { temperature: 1 },
      ];
      const requests: GenerationRequest[] = settings.map((st, i) => ({
        promptIds: randomTokens(rng, 4 + i, V),
        maxTokens: 24,
        seed: 30 + i,
        ...st,
      }));
      const runAll = async (tensorSampler: boolean, steps: number) => {
        const gen = m.createGenerator({ maxSequences: 8, maxSequenceLength: 64, tensorSampler });
        const added = await gen.add(requests);
        const out = added.map(() => [] as StepToken[]);
        while (gen.stats().activeSequences > 0)
          for (const t of await gen.step(steps)) out[added.findIndex((a) => a.seqId === t.seqId)].push(t);
        return out;
      };
      const host = await runAll(false, 1);
      // min_tokens: no stop token among the first 6.
      expect(host[4].slice(0, 6).every((t) => t.token > 5)).toBe(true);
      for (const [tensorSampler, steps] of [
        [true, 1],
        [false, 4],
        [true, 4],
      ] as const) {
        const other = await runAll(tensorSampler, steps);
        requests.forEach((_, i) => {
          expect(other[i].map((t) => t.token)).toEqual(host[i].map((t) => t.token));
          expect(
            maxAbsDiff(
              other[i].map((t) => t.logprob),
              host[i].map((t) => t.logprob),
            ),
          ).toBeLessThanOrEqual(1e-5);
        });
      }
      // The penalties change what is sampled: the same seed without them differs.
      const plain = await generate(m.createGenerator({ maxSequences: 2, maxSequenceLength: 64 }), [
        { ...requests[0], presencePenalty: 0 },
      ]);
      expect(plain[0].tokens).not.toEqual(host[0].map((t) => t.token));
    });

    test('settings the engine cannot take are refused', async () => {
      const gen = m.createGenerator({ maxSequences: 2, maxSequenceLength: 16 });
      await expect(gen.add([{ promptIds: [1], logitBias: { tokenIds: [V], biases: [1] } }])).rejects.toThrow(
        /logitBias: token id 1024 is outside the vocabulary \(size 1024\)/,
      );
      await expect(gen.add([{ promptIds: [1], logitBias: { tokenIds: [1], biases: [NaN] } }])).rejects.toThrow(
        /logitBias: the bias of token 1 is not finite/,
      );
      await expect(gen.add([{ promptIds: [1], presencePenalty: Infinity }])).rejects.toThrow(/must be finite/);
      await expect(gen.add([{ promptIds: [1], minTokens: -1 }])).rejects.toThrow(/minTokens must be >= 0/);
    });
  });

  test('errors', async () => {
    const gen = model.createGenerator({ maxSequences: 2, maxSequenceLength: 8 });
    await expect(gen.add([{ promptIds: [1, 300] }])).rejects.toThrow(/token id 300 at index 1 is out of range/);
    await expect(gen.add([{ promptIds: [] }])).rejects.toThrow(/at least one token/);
    await expect(gen.add([{ promptIds: Array(9).fill(1) }])).rejects.toThrow(/exceeds maxSequenceLength 8/);
    await expect(gen.add([{ promptIds: [1], topP: 0 }])).rejects.toThrow(/topP/);
    await expect(gen.add([{ promptIds: [1] }, { promptIds: [2], maxTokens: 0 }])).rejects.toThrow(/maxTokens/);
    expect(gen.stats().activeSequences).toBe(0); // a bad request in a batch admits none of it
    expect(await gen.step()).toEqual([]);
    // Two sequences at most: the first two of three are admitted, the third is left to the caller.
    const roomy = model.createGenerator({ maxSequences: 2, maxSequenceLength: 8, kvCacheTokens: 64 });
    expect((await roomy.add([{ promptIds: [1] }, { promptIds: [2] }, { promptIds: [3] }])).length).toBe(2);
    // Blocks for one prompt (of 2 x 8 positions, one block): the second waits for the first to end.
    expect((await gen.add([{ promptIds: [1] }, { promptIds: [2] }])).length).toBe(1);
    const small = model.createGenerator({ maxSequences: 2, maxSequenceLength: 64, kvCacheTokens: 32 });
    await expect(small.add([{ promptIds: [1, 2], maxTokens: 40 }])).rejects.toThrow(
      /need up to 41 KV positions; the cache holds 32 \(2 blocks of 16\)/,
    );
    expect(() => model.createGenerator({ maxSequences: 0, maxSequenceLength: 8 })).toThrow(/maxSequences/);
    expect(() => model.createGenerator({ maxSequences: 4, maxSequenceLength: 8, maxBatchedTokens: 2 })).toThrow(
      /maxBatchedTokens \(2\) must be at least maxSequences \(4\)/,
    );
    // What the engine refuses about one option names it: `option` and `reason` on the error, the
    // message `<option>: <reason>`.
    const refused = (options: Partial<GeneratorOptions>) => {
      try {
        model.createGenerator({ maxSequences: 1, maxSequenceLength: 8, ...options });
      } catch (e) {
        expect(isEngineOptionError(e)).toBe(true);
        const { option, reason, message } = e as EngineOptionError;
        expect(message).toBe(`${option}: ${reason}`);
        return { option, reason };
      }
      throw new Error('createGenerator accepted it');
    };
    expect(refused({ prefixSharing: 'all' as 'off' })).toEqual({
      option: 'prefixSharing',
      reason: "'all' is not one of cache, live, off",
    });
    expect(refused({ gpuMemoryUtilization: 0.5 })).toEqual({
      option: 'gpuMemoryUtilization',
      reason: 'sizes the KV cache of a CUDA device; the model is on cpu',
    });
    expect(refused({ pagedAttentionKernel: true })).toMatchObject({ option: 'pagedAttentionKernel' });
    expect(refused({ pagedAttentionKernel: true }).reason).toMatch(
      /^this build of the addon has no CUDA|^the model is not on a CUDA device/,
    );
  });
});
