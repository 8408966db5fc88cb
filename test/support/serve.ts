/** Driving a native generator in tests: requests fed as it has room, steps until all finished, and comparisons of the outputs. */
import type { GenerationRequest, Generator, GeneratorOptions, NativeModel } from '../../native';
import { createCheckedGenerator } from '../../native/testing';
import type { ArchConfig } from '../../lib/model/arch';
import { loadModel } from '../../lib/model/engine';
import { randomTokens, randomWeights } from '../../lib/model/testing';
import { Rng } from '../../lib/model/rng';

export interface Out {
  tokens: number[];
  logprobs: number[];
  finishReason?: string;
  promptLogprobs?: Float32Array;
}

export interface ServeOptions {
  maxSteps?: number;
  /** Called after each step with its index and the ids of the requests admitted so far. */
  afterStep?: (step: number, seqIds: number[]) => Promise<void> | void;
}

/** Feeds the requests to the generator in order as it has room, and steps until all finished. */
export async function serve(gen: Generator, requests: GenerationRequest[], opts: ServeOptions = {}): Promise<Out[]> {
  const out: Out[] = requests.map(() => ({ tokens: [], logprobs: [] }));
  const index = new Map<number, number>();
  const seqIds: number[] = [];
  let next = 0;
  for (let step = 0; next < requests.length || gen.stats().activeSequences > 0; step++) {
    if (step > 20_000) throw new Error('no progress');
    if (next < requests.length) {
      for (const a of await gen.add(requests.slice(next))) {
        index.set(a.seqId, next++);
        seqIds.push(a.seqId);
      }
    }
    for (const t of await gen.step(opts.maxSteps ?? 1)) {
      const o = out[index.get(t.seqId)!];
      if (t.first) o.promptLogprobs = t.promptLogprobs;
      o.tokens.push(t.token);
      o.logprobs.push(t.logprob);
      if (t.finished) o.finishReason = t.finishReason;
    }
    await opts.afterStep?.(step, seqIds);
  }
  return out;
}

export const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
};

/** Same tokens, logprobs within tol. */
export function expectSame(a: Out[], b: Out[], tol = 1e-5): void {
  expect(a.map((o) => o.tokens)).toEqual(b.map((o) => o.tokens));
  expect(a.map((o) => o.finishReason)).toEqual(b.map((o) => o.finishReason));
  a.forEach((o, i) => expect(maxAbsDiff(o.logprobs, b[i].logprobs)).toBeLessThanOrEqual(tol));
}

/**
 * The caches a generator's scenarios run on: the paged KV cache alone, and with the state slots of
 * hybrid models (native/src/state_slots.h), whose state is the probe of native/testing.ts for a
 * model without state layers: stepped like a recurrent layer, checked at every forward.
 */
export const KINDS = ['paged KV', 'paged KV + state slots'] as const;
export type CacheKindName = (typeof KINDS)[number];

/** A generator of `model` over the cache `kind`. */
export function generatorOf(kind: CacheKindName, model: NativeModel, options: GeneratorOptions): Generator {
  return kind === 'paged KV'
    ? model.createGenerator(options)
    : createCheckedGenerator(model, options, { stateProbe: true });
}

/**
 * Weight updates as a generator meets them, on random models of `cfg` (weights of seed 40, then
 * 41) through the generators `make` builds: what a finished request left in the prefix cache (its
 * blocks and, hybrid, state snapshots) is not reused after an update; a prompt being prefilled in
 * chunks when the weights change (a second request following it) is prefilled again on the new
 * ones. Either way the tokens are those of a generator on the new weights (logprobs within tol).
 */
export function weightUpdateTests(
  cfg: ArchConfig,
  make: (m: NativeModel, o: GeneratorOptions) => Generator,
  tol = 1e-5,
): void {
  const prompt = randomTokens(new Rng(14), 40, cfg.vocabSize);
  const request: GenerationRequest = { promptIds: prompt, maxTokens: 12, temperature: 1, seed: 3 };
  const models = async () => ({
    m: await loadModel(cfg, randomWeights(cfg, 40)),
    next: randomWeights(cfg, 41),
    fresh: await loadModel(cfg, randomWeights(cfg, 41)),
  });

  test('invalidate cached prefixes: no token of the new policy is computed on old K/V or state', async () => {
    const { m, next, fresh } = await models();
    const expected = await serve(fresh.createGenerator({ maxSequences: 4, maxSequenceLength: 128 }), [request]);
    const gen = make(m, { maxSequences: 4, maxSequenceLength: 128, prefixSharing: 'cache' });
    await serve(gen, [request]);
    expect(gen.stats().blocksCached).toBeGreaterThan(0);
    if (gen.stats().state) expect(gen.stats().state!.cached).toBeGreaterThan(0);
    await m.loadWeights(next);
    const hits = gen.stats().prefixHitTokens;
    expectSame(await serve(gen, [request]), expected, tol);
    expect(gen.stats().prefixHitTokens).toBe(hits);
  });

  test('a prompt being prefilled in chunks when the weights change is prefilled again on the new ones', async () => {
    const { m, next, fresh } = await models();
    const opts = { maxSequences: 4, maxSequenceLength: 128, maxBatchedTokens: 8 } as const;
    // Two requests with this prompt: the second follows the first's prefill (shared blocks).
    const two = [request, { ...request, seed: 4 }];
    const expected = await serve(fresh.createGenerator(opts), two);
    const gen = make(m, { ...opts, prefixSharing: 'cache' });
    let updated = false;
    const res = await serve(gen, two, {
      afterStep: async (step) => {
        if (step !== 1) return;
        expect(gen.stats().cachedTokens).toBe(16); // two chunks of 8 of the leader's prompt
        await m.loadWeights(next);
        updated = true;
      },
    });
    expect(updated).toBe(true);
    expectSame(res, expected, tol);
  });
}
