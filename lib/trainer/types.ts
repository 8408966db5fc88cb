/** What the trainer runtime reports per step and in total (activities pass these on as they are). */

/** Trainer metrics of one step (DESIGN.md: loss, entropy, mismatch KL, masked fractions, ...). */
export interface TrainMetrics {
  loss: number;
  entropy: number;
  mismatch_kl: number;
  masked_tokens: number;
  masked_sequences: number;
  clipped: number;
  grad_norm: number;
  lr: number;
  tokens: number;
  loss_tokens: number;
  tokens_per_s: number;
  seconds: { load: number; replay: number; train: number; save: number };
}

/** Cumulative trainer counters: equal between an interrupted and an uninterrupted run. */
export interface TrainProgress {
  steps: number;
  samples: number;
  tokens: number;
}
