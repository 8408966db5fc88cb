/**
 * Which samples each SFT optimizer step trains on. The data is read as one stream of epochs, each
 * a seeded shuffle of the whole dataset; step k takes samples [k * batch_size, (k + 1) * batch_size)
 * of that stream, so every step has a full batch (a batch may straddle two epochs) and the batch
 * of any step is a pure function of (seed, dataset size, batch size, step): a run resumed at step
 * k sees exactly the batches it would have seen.
 *
 * Length: `max_steps` when set, else enough steps for `epochs` passes (the last batch then stops at
 * the end of the last epoch, so every sample is seen exactly `epochs` times).
 */
import { Rng, shuffle } from '../envs/random';

export interface SftScheduleOptions {
  datasetSize: number;
  batchSize: number;
  epochs: number;
  maxSteps?: number;
  seed: number;
}

export interface SftStepBatch {
  step: number;
  /** Epoch (0-based) of the batch's first sample. */
  epoch: number;
  /** Indices into the dataset, in training order. */
  indices: number[];
}

const positiveInt = (v: number) => Number.isSafeInteger(v) && v > 0;

export class SftSchedule {
  readonly totalSteps: number;
  /** Samples the schedule serves in all; the end of the stream. */
  private readonly streamEnd: number;
  private readonly opts: SftScheduleOptions;
  /** The last epoch's order: consecutive steps mostly share an epoch. */
  private cached: { epoch: number; order: number[] } | undefined;

  constructor(opts: SftScheduleOptions) {
    for (const key of ['datasetSize', 'batchSize', 'epochs'] as const) {
      if (!positiveInt(opts[key])) throw new Error(`SFT schedule: ${key} must be a positive integer, got ${opts[key]}`);
    }
    if (opts.maxSteps !== undefined && !positiveInt(opts.maxSteps)) {
      throw new Error(`SFT schedule: maxSteps must be a positive integer, got ${opts.maxSteps}`);
    }
    this.opts = opts;
    if (opts.maxSteps !== undefined) {
      this.totalSteps = opts.maxSteps;
      this.streamEnd = opts.maxSteps * opts.batchSize;
    } else {
      this.streamEnd = opts.epochs * opts.datasetSize;
      this.totalSteps = Math.ceil(this.streamEnd / opts.batchSize);
    }
  }

  /** The samples of optimizer step `step` (0-based). */
  batch(step: number): SftStepBatch {
    if (!Number.isSafeInteger(step) || step < 0 || step >= this.totalSteps) {
      throw new Error(`SFT schedule: step ${step} is outside 0..${this.totalSteps - 1}`);
    }
    const { batchSize, datasetSize } = this.opts;
    const from = step * batchSize;
    const to = Math.min(from + batchSize, this.streamEnd);
    const indices: number[] = [];
    for (let p = from; p < to; p++) indices.push(this.order(Math.floor(p / datasetSize))[p % datasetSize]);
    return { step, epoch: Math.floor(from / datasetSize), indices };
  }

  private order(epoch: number): number[] {
    if (this.cached?.epoch !== epoch) {
      const order = shuffle(
        new Rng(this.opts.seed, `sft/epoch/${epoch}`),
        Array.from({ length: this.opts.datasetSize }, (_, i) => i),
      );
      this.cached = { epoch, order };
    }
    return this.cached.order;
  }
}

/** A sample of a mix's batch: the source it comes from and its index in that source. */
export interface SftMixSample {
  source: number;
  index: number;
}

export interface SftMixOptions {
  /** Each source's examples and its ratio (relative to the others'). */
  sources: readonly { size: number; ratio: number }[];
  batchSize: number;
  epochs: number;
  maxSteps?: number;
  seed: number;
}

/**
 * Which samples each step takes from several sources mixed by ratio (`[[data.source]]`). The
 * batches are one stream of sample slots; slot after slot goes to the source with the most credit
 * (each slot every source gains its share, ratio / the ratios' sum, and the source taken pays 1:
 * smooth weighted round robin), so each source gets its share of every stretch of slots, within
 * one sample, in a fixed order. Each source reads its own stream of epochs, each a seeded shuffle
 * of it, as SftSchedule does for one dataset: a step's batch is a pure function of the options and
 * the step.
 *
 * Length: `max_steps` when set, else until every source has been seen `epochs` times (the small
 * ones go round more often at their ratio, as the `datasets` library's all_exhausted interleave).
 */
export class SftMixSchedule {
  readonly totalSteps: number;
  private readonly shares: number[];
  private readonly opts: SftMixOptions;
  /** The slots assigned so far (each its source), the next slot's credits, each source's slots so far. */
  private slot = 0;
  private credit: number[];
  private counts: number[];
  private readonly assigned: number[] = [];
  /** Each source's slots before the first slot of each step assigned so far. */
  private readonly atStep: number[][] = [];
  private readonly orders = new Map<string, number[]>();

  constructor(opts: SftMixOptions) {
    if (opts.sources.length === 0) throw new Error('SFT mix: no sources');
    for (const [i, s] of opts.sources.entries()) {
      if (!positiveInt(s.size)) throw new Error(`SFT mix: source ${i} has no examples`);
      if (!(s.ratio > 0 && Number.isFinite(s.ratio)))
        throw new Error(`SFT mix: source ${i} has ratio ${s.ratio}, not > 0`);
    }
    for (const key of ['batchSize', 'epochs'] as const)
      if (!positiveInt(opts[key])) throw new Error(`SFT mix: ${key} must be a positive integer, got ${opts[key]}`);
    this.opts = opts;
    const total = opts.sources.reduce((a, s) => a + s.ratio, 0);
    this.shares = opts.sources.map((s) => s.ratio / total);
    this.credit = opts.sources.map(() => 0);
    this.counts = opts.sources.map(() => 0);
    if (opts.maxSteps !== undefined) this.totalSteps = opts.maxSteps;
    else {
      // Enough slots for each source's epochs at its share, then steps until the last is through.
      const need = opts.sources.map((s) => s.size * opts.epochs);
      let steps = Math.max(1, Math.ceil(Math.max(...need.map((n, i) => n / this.shares[i])) / opts.batchSize));
      const seen = () => {
        this.fill(steps * opts.batchSize);
        return this.counts;
      };
      while (seen().some((c, i) => c < need[i])) steps++;
      this.totalSteps = steps;
    }
  }

  /** Assigns slots up to `slots`. */
  private fill(slots: number): void {
    for (; this.slot < slots; this.slot++) {
      if (this.slot % this.opts.batchSize === 0) this.atStep.push([...this.counts]);
      for (let i = 0; i < this.credit.length; i++) this.credit[i] += this.shares[i];
      let best = 0;
      for (let i = 1; i < this.credit.length; i++) if (this.credit[i] > this.credit[best]) best = i;
      this.credit[best] -= 1;
      this.counts[best]++;
      this.assigned.push(best);
    }
  }

  /** The samples of optimizer step `step` (0-based), in slot order. */
  batch(step: number): SftMixSample[] {
    if (!Number.isSafeInteger(step) || step < 0 || step >= this.totalSteps)
      throw new Error(`SFT mix: step ${step} is outside 0..${this.totalSteps - 1}`);
    const { batchSize } = this.opts;
    this.fill((step + 1) * batchSize);
    // Each source's position in its stream at the step's first slot: its slots before it.
    const position = [...this.atStep[step]];
    const out: SftMixSample[] = [];
    for (let k = step * batchSize; k < (step + 1) * batchSize; k++) {
      const source = this.assigned[k];
      const p = position[source]++;
      const size = this.opts.sources[source].size;
      out.push({ source, index: this.order(source, Math.floor(p / size))[p % size] });
    }
    return out;
  }

  private order(source: number, epoch: number): number[] {
    const key = `${source}/${epoch}`;
    let order = this.orders.get(key);
    if (!order) {
      order = shuffle(
        new Rng(this.opts.seed, `sft/source/${source}/epoch/${epoch}`),
        Array.from({ length: this.opts.sources[source].size }, (_, i) => i),
      );
      // Consecutive steps mostly share an epoch: keep a few orders only.
      if (this.orders.size > 2 * this.opts.sources.length) this.orders.clear();
      this.orders.set(key, order);
    }
    return order;
  }
}
