/**
 * Dataset builders. Both make example i of split s a pure function of (seed, s, i), so rollout
 * activities can be retried anywhere and reproduce the same prompts without shared state.
 */
import { hash32, Rng, shuffle } from './random';
import type { Dataset, Example, Split } from './types';

function checkIndex(index: number): void {
  if (!Number.isSafeInteger(index) || index < 0)
    throw new Error(`example index must be a non-negative integer, got ${index}`);
}

export interface GeneratedDatasetOptions {
  /** Names the random streams, so two envs with the same seed draw different examples. */
  name: string;
  /** Draws one example; called again with the same rng when the split rejects the draw. */
  generate(rng: Rng): Example;
  /**
   * Identity of an example (e.g. its question text). When given, train and eval are disjoint: an
   * example belongs to eval exactly when hash(seed, key) falls in the first `evalFraction` of the
   * hash range, and each split redraws until it gets one of its own. Leave it out when the space
   * of examples is too small to hold any out (then the splits are only independent draws).
   */
  key?(example: Example): string;
  /** Share of the example space reserved for eval (default 0.1). */
  evalFraction?: number;
}

/** A split's draws are rejected at most this often before the dataset is declared infeasible. */
const MAX_DRAWS = 10_000;

export function generatedDataset(opts: GeneratedDatasetOptions): Dataset {
  const evalFraction = opts.evalFraction ?? 0.1;
  if (!(evalFraction > 0 && evalFraction < 1))
    throw new Error(`${opts.name}: evalFraction must be in (0, 1), got ${evalFraction}`);
  const { key } = opts;
  return {
    size: () => undefined,
    example(split: Split, index: number, seed: number): Example {
      checkIndex(index);
      const rng = new Rng(seed, `${opts.name}/${split}/${index}`);
      if (!key) return opts.generate(rng);
      for (let draw = 0; draw < MAX_DRAWS; draw++) {
        const example = opts.generate(rng);
        const isEval = hash32(`${seed}\u0000${key(example)}`) / 4294967296 < evalFraction;
        if (isEval === (split === 'eval')) return example;
      }
      throw new Error(
        `${opts.name}: no ${split} example in ${MAX_DRAWS} draws; the example space is too small for a held-out split`,
      );
    },
  };
}

export interface ListDatasetOptions {
  /** Examples held out for eval: a count, or a share of the list (default 0.1). */
  evalSize?: number;
}

/**
 * A fixed list of examples, split by a seeded shuffle: the first `evalSize` shuffled examples are
 * eval, the rest train, each split in shuffled order.
 */
export function listDataset(examples: readonly Example[], opts: ListDatasetOptions = {}): Dataset {
  const requested = opts.evalSize ?? 0.1;
  const evalCount = requested < 1 ? Math.round(examples.length * requested) : requested;
  if (!Number.isInteger(evalCount) || evalCount < 0 || evalCount > examples.length) {
    throw new Error(`listDataset: evalSize ${requested} does not fit ${examples.length} examples`);
  }
  const orders = new Map<number, number[]>();
  const order = (seed: number) => {
    let o = orders.get(seed);
    if (!o) {
      o = shuffle(
        new Rng(seed, 'list-dataset/split'),
        examples.map((_, i) => i),
      );
      orders.set(seed, o);
    }
    return o;
  };
  const sizes = { train: examples.length - evalCount, eval: evalCount };
  return {
    size: (split) => sizes[split],
    example(split, index, seed) {
      checkIndex(index);
      if (index >= sizes[split])
        throw new Error(`example ${index} is out of range: the ${split} split has ${sizes[split]}`);
      return examples[order(seed)[split === 'eval' ? index : evalCount + index]];
    },
  };
}
