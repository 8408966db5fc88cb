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
