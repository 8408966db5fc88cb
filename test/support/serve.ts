/** Driving a native generator in tests: requests fed as it has room, steps until all finished, and comparisons of the outputs. */
import type { GenerationRequest, Generator, GeneratorOptions, NativeModel } from '../../native';
import { createCheckedGenerator } from '../../native/testing';

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
