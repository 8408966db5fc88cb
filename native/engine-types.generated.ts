// Generated from the addon's engineTypes() (the X-macro lists of native/src/trainer.h) by
// `npm run gen:engine-types`: do not edit.

export interface AdamWOptions {
  /** Decay of the running mean of the gradients. Default 0.9. */
  beta1?: number;
  /** Decay of the running mean of the squared gradients. Default 0.999. */
  beta2?: number;
  /** Added to the denominator (the root of the second moment). Default 1e-8. */
  eps?: number;
  /** Decoupled weight decay: each step shrinks the weights by lr x this. Default 0.01. */
  weightDecay?: number;
}

export interface TrainStepFields {
  /** The learning rate the step used (0 for gradients()). */
  lr: number;
  /** Wall time of the call. */
  seconds: number;
  /** Of which the forward and backward passes over every row. */
  forwardBackwardSeconds: number;
  /** Of which the gradient sync, clipping and AdamW. */
  optimizerSeconds: number;
  /** Data parallel (0 otherwise): the time some collective of the step ran (gathers, reduce-scatters, all-reduces, broadcasts; waiting for the other ranks included). */
  commSeconds: number;
  /** Of which the part the step waited for; the rest ran behind compute (full sharding's prefetched gathers and reduce-scatters). */
  commExposedSeconds: number;
}
