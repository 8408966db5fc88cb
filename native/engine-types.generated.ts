// Generated from the addon's engineTypes() (the X-macro lists of native/src: facts.h says how) by
// `npm run gen:engine-types`: do not edit.

export const PREFIX_SHARINGS = ['cache', 'live', 'off'] as const;
export type PrefixSharing = (typeof PREFIX_SHARINGS)[number];

export const SHARDINGS = ['optimizer', 'full'] as const;
export type Sharding = (typeof SHARDINGS)[number];

export const DIST_BACKENDS = ['auto', 'gloo', 'nccl'] as const;
export type DistBackend = (typeof DIST_BACKENDS)[number];

export const LOSS_NORMALIZATIONS = ['token', 'sequence'] as const;
export type LossNormalization = (typeof LOSS_NORMALIZATIONS)[number];

export const MISMATCH_MODES = ['none', 'tis', 'mask'] as const;
export type MismatchMode = (typeof MISMATCH_MODES)[number];

export interface GeneratorOptions {
  /** The most sequences running (decoded together) at once. */
  maxSequences: number;
  /** Longest prompt + completion of one sequence. */
  maxSequenceLength: number;
  /** The paged KV cache's size in token positions, rounded up to whole blocks. 0 (unset): with `gpuMemoryUtilization`, what that share of the device leaves after the weights, a forward of `maxBatchedTokens` tokens and the state slots; else maxSequences x maxSequenceLength. Default 0. */
  kvCacheTokens?: number;
  /** CUDA only, without kvCacheTokens: the share of the device's memory in use at most, in (0, 1] (vLLM's); 0: unset. Default 0. */
  gpuMemoryUtilization?: number;
  /** Token positions per KV block. Default 16. */
  blockSize?: number;
  /** Sequences with a common token prefix share its blocks, prefilled once ('live': while they run together; 'cache': also the prefixes of finished sequences, kept until their blocks are needed); 'off': each sequence computes all its tokens. Prefixes are keyed by the weights: any weight change makes them unmatchable. Default 'cache'. */
  prefixSharing?: PrefixSharing;
  /** Tokens one step computes: a decode row per running sequence, prefill chunks in the rest (vLLM's max_num_batched_tokens). Default 2048. */
  maxBatchedTokens?: number;
  /** Hybrid models (state layers, e.g. Gated DeltaNet): per-sequence state slots in all, one per running sequence and the rest for the prefix cache's state snapshots. 0: maxSequences, twice that with prefixSharing 'cache'. Refused for a model without state layers. Default 0. */
  stateSlots?: number;
  /** Sample with tensor ops on the logits' device, as it is done on CUDA, also on the CPU (where the host sampler is the default). For tests of the CUDA path: same tokens for the same seeds. Default false. */
  tensorSampler?: boolean;
  /** Replay decode steps from CUDA graphs (one per batch and key-length bucket, captured on first use) where the model allows: on CUDA, dense models. false: every step eager. Default true. */
  cudaGraphs?: boolean;
  /** Decode attention through the engine's own CUDA kernel (flash-decoding over the blocks in place) instead of libtorch's matmuls over gathered blocks; refused off CUDA or in a build without it. Default false. */
  pagedAttentionKernel?: boolean;
}

export const GENERATOR_DEFAULTS = {
  kvCacheTokens: 0,
  gpuMemoryUtilization: 0,
  blockSize: 16,
  prefixSharing: 'cache',
  maxBatchedTokens: 2048,
  stateSlots: 0,
  tensorSampler: false,
  cudaGraphs: true,
  pagedAttentionKernel: false,
} as const;

export interface GeneratorCounters {
  /** Sequences decoding or prefilling, holding their blocks. */
  runningSequences: number;
  /** Sequences preempted (blocks freed), waiting to be recomputed. */
  preemptedSequences: number;
  /** Positions of the running sequences whose K/V are in the cache. */
  cachedTokens: number;
  /** Blocks some sequence holds. */
  blocksInUse: number;
  /** Blocks nobody holds that keep a finished sequence's prefix (reused, or taken when needed). */
  blocksCached: number;
  /** Since creation: sequences preempted. */
  preemptions: number;
  /** Since creation: prompt positions computed (those of preempted sequences computed again included). */
  prefillTokens: number;
  /** Since creation: positions taken from blocks (and states) other sequences computed. */
  prefixHitTokens: number;
}

export interface StateSlotStats {
  /** Slots in all: one per running sequence, the rest for the prefix cache's state snapshots. */
  slots: number;
  /** Held by running sequences. */
  inUse: number;
  /** Holding state snapshots the prefix cache keeps for reuse. */
  cached: number;
  /** The bytes of one slot. */
  slotBytes: number;
}

export interface StepTimes {
  /** `step` calls that ran something. */
  calls: number;
  /** The forwards they ran (several per call with maxSteps). */
  steps: number;
  /** Resuming preempted sequences, preempting, taking blocks (copy-on-write included). */
  plan: number;
  /** Token ids, positions and block tables built and sent to the device. */
  inputs: number;
  /** The forwards and logits (on CUDA: launching them, or replaying graphs). */
  forward: number;
  /** Of which attention over the paged cache, on the CPU (CUDA's is launched asynchronously). */
  attention: number;
  /** Sampling and reading the tokens back (on CUDA: waiting for the device too). */
  sample: number;
  /** Stop and length checks, freeing blocks, the prefix index, the results. */
  finish: number;
  /** CUDA: from each call's first launch to its last result, by the device's clock (0 elsewhere). */
  device: number;
}

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

export const ADAMW_DEFAULTS = {
  beta1: 0.9,
  beta2: 0.999,
  eps: 1e-8,
  weightDecay: 0.01,
} as const;

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

export interface MismatchBounds {
  /** tis: each token's policy term times min(ratio, tisCap). Default 2. */
  tisCap?: number;
  /** mask: tokens with a ratio below this are dropped. Default 0.125. */
  tokenLow?: number;
  /** mask: tokens with a ratio above this are dropped. Default 8. */
  tokenHigh?: number;
  /** mask: samples whose geometric-mean ratio is below this are dropped. Default 0.1. */
  seqLow?: number;
  /** mask: samples whose geometric-mean ratio is above this are dropped. Default 10. */
  seqHigh?: number;
}

export const MISMATCH_DEFAULTS = {
  tisCap: 2,
  tokenLow: 0.125,
  tokenHigh: 8,
  seqLow: 0.1,
  seqHigh: 10,
} as const;
