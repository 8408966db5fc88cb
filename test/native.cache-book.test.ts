/**
 * The generator's cache bookkeeping on its own (native/testing.ts CacheBook: the cache manager
 * driven by hand, no forward of the model): blocks taken and shared, copy-on-write, the eviction
 * order of freed prefixes, preemption, and the state slots of hybrid models (with the state probe
 * as their state, checked at every forward the book runs).
 */
import { setThreads, type GeneratorOptions, type NativeModel } from '../native';
import { CacheBook } from '../native/testing';
import { loadModel } from '../lib/model/engine';
import { randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';

setThreads(1);

const cfg = tinyConfig('qwen3');
const weights = randomWeights(cfg, 1);
let model: NativeModel;
beforeAll(async () => {
  model = await loadModel(cfg, weights);
});
// 8 blocks of 4 positions.
const options = (prefixSharing: GeneratorOptions['prefixSharing'], extra: Partial<GeneratorOptions> = {}) => ({
  maxSequences: 8,
  maxSequenceLength: 32,
  kvCacheTokens: 32,
  blockSize: 4,
  prefixSharing,
  ...extra,
});
const tokens = (n: number, seed: number) => randomTokens(new Rng(seed), n, cfg.vocabSize);

/** Admits, or fails the test. */
function admit(book: CacheBook, t: number[]): number {
  const id = book.admit(t);
  expect(id).not.toBeNull();
  return id!;
}

describe('blocks', () => {
  test('taken lowest first as a sequence grows, shared by reference, given back when it leaves', () => {
    const book = new CacheBook(model, options('live'));
    const prompt = tokens(10, 1); // two full blocks and a partial one
    const a = admit(book, prompt);
    expect(book.sequence(a)).toMatchObject({ computed: 0, blocks: [0, 1, 2], leader: 0, slot: -1 });
    book.forward([[a, 10]]);
    for (const [i, token] of [7, 8, 9].entries()) {
      book.append(a, token);
      book.forward([[a, 11 + i]], 1); // decode rows: position 12 takes a fourth block
    }
    expect(book.sequence(a)).toMatchObject({ computed: 13, blocks: [0, 1, 2, 3] });
    // Its two computed full blocks are shared; the rest of b's prompt gets a block of its own.
    const b = admit(book, [...prompt.slice(0, 8), 5, 6]);
    expect(book.sequence(b)).toMatchObject({ computed: 8, blocks: [0, 1, 4] });
    expect([0, 1, 2, 4].map((blk) => book.refs(blk))).toEqual([2, 2, 1, 1]);
    expect(book.state()).toMatchObject({ blocksInUse: 5, prefixHitTokens: 8 });
    book.release(a, true); // 'live': nothing kept once nobody holds it
    expect([0, 1, 2, 3].map((blk) => book.refs(blk))).toEqual([1, 1, 0, 0]);
    expect(book.state()).toMatchObject({ blocksInUse: 3, blocksCached: 0, available: 5 });
    book.release(b, true);
    expect(book.state()).toMatchObject({ blocksInUse: 0, available: 8 });
  });

  test('admission counts blocks: a prompt the free and cached blocks cannot hold waits', () => {
    const book = new CacheBook(model, options('cache'));
    const a = admit(book, tokens(20, 2)); // 5 blocks
    expect(book.admit(tokens(13, 3))).toBeNull(); // 4 more, plus the 1-block watermark for a's growth
    expect(book.admit(tokens(8, 3))).not.toBeNull(); // 2 more
    book.release(a, false);
  });

  test('copy-on-write: a shared block is copied before a sequence writes into it', () => {
    const book = new CacheBook(model, options('cache'));
    const prompt = tokens(8, 4); // two full blocks
    const a = admit(book, prompt);
    book.forward([[a, 8]]);
    book.release(a, true);
    // Two requests of that prompt: both blocks from the cache, the last position computed again
    // (its logits are needed), each in its own copy of the last block while the other holds it.
    const b = admit(book, prompt);
    const c = admit(book, prompt);
    expect(book.sequence(b)).toMatchObject({ computed: 7, blocks: [0, 1] });
    expect(book.sequence(c)).toMatchObject({ computed: 7, blocks: [0, 1] });
    book.forward([[b, 8]], 1);
    const copied = book.sequence(b).blocks;
    expect(copied[0]).toBe(0);
    expect(copied[1]).not.toBe(1);
    expect([book.refs(0), book.refs(1), book.refs(copied[1])]).toEqual([2, 1, 1]);
    book.forward([[c, 8]], 1); // alone on block 1 now: written in place
    expect(book.sequence(c).blocks).toEqual([0, 1]);
    book.release(b, true);
    book.release(c, true);
  });

  test('freed prefixes are evicted tail first: the first block, which every reuse needs, goes last', () => {
    const book = new CacheBook(model, options('cache'));
    const prompt = tokens(12, 5);
    const a = admit(book, prompt);
    expect(book.sequence(a).blocks).toEqual([0, 1, 2]);
    book.forward([[a, 12]]);
    book.release(a, true);
    expect(book.state()).toMatchObject({ blocksCached: 3, parked: [2, 1, 0] });
    // 6 blocks for another prompt: the 5 free ones, then the tail of the cached prefix.
    const d = admit(book, tokens(24, 6));
    expect(book.state().parked).toEqual([1, 0]);
    book.release(d, false);
    // The prefix's head is still there: a request with it takes 2 blocks and computes the third.
    const e = admit(book, prompt);
    expect(book.sequence(e)).toMatchObject({ computed: 8 });
    expect(book.sequence(e).blocks.slice(0, 2)).toEqual([0, 1]);
  });

  test('preemption gives the blocks back; the sequence resumes from what the cache kept of them', () => {
    for (const prefixSharing of ['live', 'cache'] as const) {
      const book = new CacheBook(model, options(prefixSharing));
      const prompt = tokens(10, 7);
      const a = admit(book, prompt);
      book.forward([[a, 10]]);
      book.release(a, false); // preempted
      expect(book.state()).toMatchObject({ blocksInUse: 0, blocksCached: prefixSharing === 'cache' ? 2 : 0 });
      const again = admit(book, prompt);
      expect(book.sequence(again).computed).toBe(prefixSharing === 'cache' ? 8 : 0);
    }
  });

  test('a new policy epoch (a weight update) drops the cached blocks', async () => {
    const book = new CacheBook(model, options('cache'));
    const prompt = tokens(12, 8);
    const a = admit(book, prompt);
    book.forward([[a, 12]]);
    book.release(a, true);
    expect(book.syncEpoch()).toBe(false);
    await model.loadWeights(weights);
    expect(book.syncEpoch()).toBe(true);
    expect(book.state()).toMatchObject({ blocksCached: 0, available: 8, parked: [] });
    expect(book.sequence(admit(book, prompt)).computed).toBe(0);
  });
});

describe('state slots (the probe as the state)', () => {
  const probed = (prefixSharing: GeneratorOptions['prefixSharing'], stateSlots: number) =>
    new CacheBook(model, options(prefixSharing, { stateSlots }), { stateProbe: true });

  test('a slot per running sequence; admission counts slots as it counts blocks', () => {
    const book = probed('off', 2);
    const a = admit(book, tokens(5, 9));
    const b = admit(book, tokens(5, 10));
    expect([book.sequence(a).slot, book.sequence(b).slot]).toEqual([0, 1]);
    expect(book.admit(tokens(5, 11))).toBeNull(); // blocks to spare, no slot
    book.release(a, false);
    expect(book.sequence(admit(book, tokens(5, 11))).slot).toBe(0);
    expect(book.state()).toMatchObject({ stateSlots: 2, stateSlotsInUse: 2, freeSlots: 0 });
  });

  test("followers get their leader's state at the end of the shared prefix, written by the leader's forward", () => {
    const book = probed('live', 4);
    const prompt = tokens(10, 12);
    const a = admit(book, prompt);
    const b = admit(book, prompt);
    const c = admit(book, [...prompt.slice(0, 8), 1, 2, 3]);
    expect(book.sequence(b)).toMatchObject({ leader: a, sharedLen: 10 });
    expect(book.sequence(c)).toMatchObject({ leader: a, sharedLen: 8 });
    book.forward([[a, 6]]);
    expect(book.sequence(c).leader).toBe(a); // not there yet
    book.forward([[a, 10]]); // passes 8 (c's state) and ends at 10 (b's)
    expect(book.sequence(b)).toMatchObject({ leader: 0, computed: 10 });
    expect(book.sequence(c)).toMatchObject({ leader: 0, computed: 8 });
    // Their next forwards check their slots: the states after 10 and 8 tokens.
    book.append(b, 4);
    book.forward(
      [
        [b, 11],
        [c, 11],
      ],
      1,
    );
  });

  test('a leader that leaves mid-prefill hands its state to the follower sharing most', () => {
    const book = probed('live', 4);
    const prompt = tokens(12, 13);
    const a = admit(book, prompt);
    const b = admit(book, prompt.slice(0, 10));
    const c = admit(book, prompt);
    book.forward([[a, 5]]);
    book.release(a, false);
    expect(book.sequence(c)).toMatchObject({ leader: 0, computed: 5 }); // the heir, from a's state
    expect(book.sequence(b)).toMatchObject({ leader: c });
    book.forward([[c, 12]]); // checks c's copied slot; writes b's state at 10
    expect(book.sequence(b)).toMatchObject({ leader: 0, computed: 10 });
    book.append(b, 3);
    book.forward([[b, 11]], 1);
  });

  test("the prefix cache keeps the prompt's state at its last block boundary and a finished sequence's final state; eviction least recently used first; a new epoch drops them", async () => {
    const book = probed('cache', 3);
    const prompt = tokens(10, 14);
    const a = admit(book, prompt);
    expect(book.sequence(a).slot).toBe(0);
    book.forward([[a, 10]]); // the state at 8 into slot 1
    expect(book.state()).toMatchObject({ snapshots: [1], stateSlotsInUse: 1, stateSlotsCached: 1, freeSlots: 1 });
    // The same prompt resumes at 8 from a copy of that snapshot (checked by its forward).
    const b = admit(book, prompt);
    expect(book.sequence(b)).toMatchObject({ computed: 8, slot: 2 });
    book.forward([[b, 10]]);
    // No slot left but the snapshot it would resume from: it waits.
    expect(book.admit(prompt)).toBeNull();
    // a finishes: its slot becomes the snapshot of its final state (after 10 tokens, its partial
    // third block kept with it).
    book.release(a, true);
    expect(book.state().snapshots).toEqual([1, 0]);
    // Its continuation resumes there: the last snapshot's slot stays, the older one is evicted
    // for the new sequence's slot.
    const next = admit(book, [...prompt, 42]);
    expect(book.sequence(next)).toMatchObject({ computed: 10, slot: 1 });
    expect(book.state().snapshots).toEqual([0]);
    book.forward([[next, 11]], 1);
    await model.loadWeights(weights);
    expect(book.syncEpoch()).toBe(true);
    expect(book.state()).toMatchObject({ snapshots: [], stateSlotsCached: 0, freeSlots: 1 });
  });

  test('a preempted sequence frees its slot and resumes from a kept snapshot', () => {
    const book = probed('cache', 3);
    const prompt = tokens(14, 15);
    const a = admit(book, prompt);
    book.forward([[a, 9]]); // not yet at its prompt's snapshot (12)
    book.release(a, false);
    expect(book.state()).toMatchObject({ stateSlotsInUse: 0, stateSlotsCached: 0, freeSlots: 3 });
    const again = admit(book, prompt);
    expect(book.sequence(again).computed).toBe(0); // blocks cached, but no state there
    book.forward([[again, 14]]);
    book.release(again, false);
    const third = admit(book, prompt);
    expect(book.sequence(third).computed).toBe(12);
    book.forward([[third, 14]]);
  });
});
