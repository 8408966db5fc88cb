/**
 * Test-only entry points of the native engine (native/src/addon/testing_wrap.cc), kept apart from
 * the production facade (native/index.ts never reaches them): a generator with checks on, and
 * CacheBook, the generator's cache manager driven step by step without the model's forward, for
 * unit tests of its bookkeeping. Imported by test/ only.
 */
import { loadAddon } from './addon';
import type { GeneratorOptions } from './engine-types.generated';
import { Generator, type RawGenerator } from './generator';
import { modelInternals } from './internals';
import type { NativeModel } from './model';

/** Test-only settings of a generator (native/src/generation.h `GeneratorChecks`). */
export interface GeneratorChecks {
  /**
   * Run the state-slot cache kind with a probe state even for a model without state layers, and
   * check every row's slot before each forward (native/src/state_probe.h).
   */
  stateProbe?: boolean;
}

/** A sequence as the cache manager holds it. */
export interface BookSequence {
  /** Tokens [0, computed) are in the cache (K/V, and the state after them in its slot). */
  computed: number;
  blocks: number[];
  /** Its state slot; -1 without the state-slot kind. */
  slot: number;
  /** The sequence whose computation it waits for (0: none), up to sharedLen. */
  leader: number;
  sharedLen: number;
}

export interface BookState {
  numBlocks: number;
  /** Blocks a sequence can take: free ones and parked (cached) ones. */
  available: number;
  blocksInUse: number;
  blocksCached: number;
  prefixHitTokens: number;
  /** Parked blocks in eviction order (least recently used first). */
  parked: number[];
  /** The slots of kept state snapshots in eviction order. */
  snapshots: number[];
  stateSlots: number;
  stateSlotsInUse: number;
  stateSlotsCached: number;
  freeSlots: number;
}

interface RawBook {
  admit(tokens: number[], opts?: { priority?: number; promptLogprobs?: boolean }): number | null;
  forward(rows: [number, number][], decodeRows: number): void;
  append(id: number, token: number): void;
  release(id: number, finished: boolean): void;
  syncEpoch(): boolean;
  sequence(id: number): BookSequence;
  refs(block: number): number;
  state(): BookState;
}

interface TestingAddon {
  createCheckedGenerator(model: unknown, options: GeneratorOptions, checks: GeneratorChecks): unknown;
  CacheBook: new (model: unknown, options: GeneratorOptions, checks: GeneratorChecks) => RawBook;
}

const addon = () => loadAddon<{ testing: TestingAddon }>().testing;

/** A generator of `model` with test-only checks on; its calls share the model's queue. */
export function createCheckedGenerator(
  model: NativeModel,
  options: GeneratorOptions,
  checks: GeneratorChecks,
): Generator {
  const { raw, queue } = modelInternals(model);
  return new Generator(addon().createCheckedGenerator(raw, options, checks) as RawGenerator, queue);
}

/**
 * The generator's cache manager over `model`'s cache, sized and shared as `options` say, driven
 * by hand: what the scheduler and the forward would do, one call each. Synchronous; keep the model
 * idle meanwhile.
 */
export class CacheBook {
  private readonly raw: RawBook;

  constructor(model: NativeModel, options: GeneratorOptions, checks: GeneratorChecks = {}) {
    this.raw = new (addon().CacheBook)(modelInternals(model).raw, options, checks);
  }

  /** Admits a sequence of these tokens; its id, or null when the cache has no room now. */
  admit(tokens: number[], opts?: { priority?: number; promptLogprobs?: boolean }): number | null {
    return this.raw.admit(tokens, opts);
  }

  /**
   * One forward over rows [id, upTo] (the first `decodeRows` of them decode rows), as the generator
   * runs it: the writes prepared (throws when they do not fit), state rows checked and written,
   * computed advanced, followers resolved, computed blocks indexed.
   */
  forward(rows: [number, number][], decodeRows = 0): void {
    this.raw.forward(rows, decodeRows);
  }

  /** A sampled token appended to the sequence. */
  append(id: number, token: number): void {
    this.raw.append(id, token);
  }

  /** The sequence gives its cache back: finished (kept for reuse where the mode says), or preempted. */
  release(id: number, finished: boolean): void {
    this.raw.release(id, finished);
  }

  /** A new policy epoch when the model's weights changed since the last call. */
  syncEpoch(): boolean {
    return this.raw.syncEpoch();
  }

  sequence(id: number): BookSequence {
    return this.raw.sequence(id);
  }

  /** References to a block (sequences holding it). */
  refs(block: number): number {
    return this.raw.refs(block);
  }

  state(): BookState {
    return this.raw.state();
  }
}
