/**
 * TypeScript facade of the native libtorch engine (`build/native/Release/prime_native.node`).
 * The rest of the code base touches the addon only through this module.
 *
 * Every compute call (load, score, generation steps, training steps, checkpoints) runs on a libuv
 * worker thread and returns a Promise, so the Node event loop stays responsive. Calls on one model
 * (and on the generators/trainers created from it) are queued and run one at a time.
 */
import * as fs from 'fs';
import * as path from 'path';
import { chooseOpenBlasCore } from './blas-core';
import type {
  EngineConfig,
  EngineTensorSpec,
  ModelBinding,
  Projection,
  TensorDType,
  WeightTensor,
} from './model-binding';
import { SerialQueue } from './serial';

import type { AdamWOptions, TrainStepFields } from './engine-types.generated';
import type { LossKindName, LossKindSpec, LossParamName } from './loss-kinds';
export * from './loss-kinds';
export * from './model-binding';
export type * from './engine-types.generated';

/** Compute dtype of a loaded model. bfloat16 is meant for CUDA; training needs float32 or float64. */
export type ComputeDType = 'float32' | 'bfloat16' | 'float64';

export interface ModelOptions {
  /** 'cpu' (default), 'cuda' or 'cuda:N' (needs a CUDA build of libtorch). */
  device?: string;
  /** Default 'float32'. */
  dtype?: ComputeDType;
  /**
   * Tokens per chunk of the LM head + log-softmax in training and scoring (memory: chunk x vocab
   * logits at a time). Default 0: on the CPU about 32M logits per chunk, between 16 and 1,024
   * tokens; on a GPU about 256M (1 GiB in fp32), between 16 and 8,192 tokens.
   */
  logitsChunkTokens?: number;
  /**
   * Bytes of log-softmax a training step keeps from the forward for the backward, per packed row
   * (whole chunks, the first ones); chunks beyond it are recomputed in the backward (one more
   * LM-head matmul each). Default 512 MiB (the first 880 tokens of a row at a 151,936-token
   * vocabulary; on a GPU less than one chunk, so every chunk is recomputed there: keeping them all ran
   * slower on an H100); 0 recomputes every chunk (least memory).
   */
  logitsKeepBytes?: number;
  /**
   * Default true: forwards that record no gradient of the q/k/v and gate/up weights (generation,
   * scoring, reference and eval) run one matmul for q/k/v and one for gate/up. false runs them one
   * by one, as training does: what fusing gains, measured with one build.
   */
  fusedProjections?: boolean;
  /**
   * Default false: RMSNorm (with the residual add), RoPE, SwiGLU and the LM head's rows run
   * libtorch's ops. true: our fused kernels (native/src/kernels.h), forward and backward, on CUDA in
   * a build that has them (`info().cudaKernels`; refused otherwise, saying why); on the CPU their
   * formulas run as tensor ops, for tests. float32 and bfloat16 models only.
   */
  fusedKernels?: boolean;
}

export type TokenIds = Int32Array | number[];

/**
 * One packed row: samples back to back, position ids restarting at 0 for each sample. A new
 * sample starts wherever a position id does not continue the previous one; attention is causal
 * and never crosses a sample boundary.
 */
export interface PackedRow {
  inputIds: TokenIds;
  positionIds: TokenIds;
}

/**
 * Per-token scores aligned with the row's tokens: `logprobs[t]` = log p(token t | the tokens
 * before it in its sample) under softmax(logits / temperature); `entropies[t]` = entropy of that
 * distribution. Both are 0 at the first token of each sample (nothing predicts it).
 */
export interface RowScores {
  logprobs: Float32Array;
  entropies: Float32Array;
}

/** What sequences share of their K/V: see `GeneratorOptions.prefixSharing`. */
export type PrefixSharing = 'off' | 'live' | 'cache';

export interface GeneratorOptions {
  /** The most sequences running (decoded together) at once. */
  maxSequences: number;
  /** Longest prompt + completion of one sequence. */
  maxSequenceLength: number;
  /**
   * The paged KV cache's size in token positions, rounded up to whole blocks. Unset: with
   * `gpuMemoryUtilization`, what that share of the device leaves after the weights and a forward
   * of `maxBatchedTokens` tokens; else maxSequences x maxSequenceLength.
   */
  kvCacheTokens?: number;
  /** CUDA only, without kvCacheTokens: the share of the device's memory in use at most, in (0, 1] (vLLM's). */
  gpuMemoryUtilization?: number;
  /** Token positions per KV block. Default 16. */
  blockSize?: number;
  /**
   * Sequences with a common token prefix share its blocks, prefilled once ('live': while they run
   * together; 'cache', the default: also the prefixes of finished sequences, kept until their
   * blocks are needed); 'off': each sequence computes all its tokens. Prefixes are keyed by the
   * weights: any weight change makes them unmatchable.
   */
  prefixSharing?: PrefixSharing;
  /** Tokens one step computes: a decode row per running sequence, prefill chunks in the rest. Default 2048. */
  maxBatchedTokens?: number;
  /**
   * Hybrid models (state layers, e.g. Gated DeltaNet): per-sequence state slots in all, one per
   * running sequence and the rest for the prefix cache's state snapshots. Default maxSequences,
   * twice that with prefixSharing 'cache'. Refused for a model without state layers.
   */
  stateSlots?: number;
  /**
   * Sample with tensor ops on the logits' device, as it is done on CUDA, also on the CPU (where
   * the host sampler is the default). For tests of the CUDA path: same tokens for the same seeds.
   */
  tensorSampler?: boolean;
  /**
   * Replay decode steps from CUDA graphs (one per batch and key-length bucket, captured on first
   * use) where the model allows: on CUDA, dense models. Default true; false: every step eager.
   */
  cudaGraphs?: boolean;
  /**
   * Decode attention through the engine's own CUDA kernel (flash-decoding over the blocks in
   * place) instead of libtorch's matmuls over gathered blocks. Default false; refused off CUDA or
   * in a build without it.
   */
  pagedAttentionKernel?: boolean;
}

export interface GenerationRequest {
  promptIds: TokenIds;
  /** 0 = greedy. Default 1. */
  temperature?: number;
  /** Default 1 (off). */
  topP?: number;
  /** -1 = off (default). */
  topK?: number;
  /** Default 0 (off). */
  minP?: number;
  /**
   * OpenAI's and vLLM's penalties on the tokens sampled so far (the prompt's not counted): each
   * logit minus frequencyPenalty x the token's count, and presencePenalty once it occurred.
   * Default 0. These, logitBias and minTokens change the logits before temperature: the tokens'
   * logprobs and top logprobs are of the distribution sampled from.
   */
  presencePenalty?: number;
  frequencyPenalty?: number;
  /** Added to these tokens' logits (OpenAI's logit_bias). */
  logitBias?: { tokenIds: number[]; biases: number[] };
  /** The stop tokens are not sampled before this many tokens (vLLM's min_tokens). Default 0. */
  minTokens?: number;
  /** Default 16. */
  maxTokens?: number;
  stopTokenIds?: number[];
  /** Same seed, same tokens, whatever else is in the batch. Random when absent. */
  seed?: number;
  /** Return raw (temperature 1) logprobs of the prompt tokens. */
  promptLogprobs?: boolean;
  /** 0..20: with every token, the k most likely tokens (OpenAI `top_logprobs`). Default 0. */
  topLogprobs?: number;
  /** MoE: return the experts each fed token was routed to (`promptRoutes`, `StepToken.routes`). */
  returnRoutes?: boolean;
  /**
   * Lower runs first (vLLM's priority, default 0): when the KV cache runs dry a step preempts the
   * highest value (the latest admitted among equals), and preempted sequences resume lowest first.
   */
  priority?: number;
}

/** The most likely tokens of one step, descending by logprob (ties: lower id first). */
export interface TopLogprobs {
  ids: Int32Array;
  logprobs: number[];
}

export interface AddedSequence {
  seqId: number;
}

export interface StepToken {
  seqId: number;
  token: number;
  /**
   * log softmax(logits / temperature)[token] over the full vocabulary, before top-k/top-p/min-p
   * filtering (greedy: temperature 1). This is the sampled-token logprob the trainer recomputes.
   */
  logprob: number;
  finished: boolean;
  /**
   * 'stop' (a stop token was sampled; it is included), 'length' (maxTokens or cache full), or
   * 'error' (no token: the logits were not finite, see `error`; the sequence is gone).
   */
  finishReason?: 'stop' | 'length' | 'error';
  /** Why the sequence failed, with finishReason 'error' (token is then -1). */
  error?: string;
  /** When the request asked for topLogprobs: from the same distribution as `logprob`. */
  topLogprobs?: TopLogprobs;
  /**
   * With returnRoutes on an MoE model: the experts (sparse layers x experts per token) of the
   * token fed in this step, whose output `token` was sampled from.
   */
  routes?: Int32Array;
  /** The sequence's first token (which carries the prompt's outputs below, when asked for). */
  first?: boolean;
  /** With the first token, when asked: one logprob per prompt token, NaN for the first. */
  promptLogprobs?: Float32Array;
  /**
   * With the first token and returnRoutes on an MoE model: the experts of prompt tokens 0..P-2
   * (the last one's are this token's `routes`), [P - 1, sparse layers, experts per token] flattened.
   */
  promptRoutes?: Int32Array;
}

export interface CacheStats {
  /** Sequences added and not finished: running, or preempted (waiting to be recomputed). */
  activeSequences: number;
  runningSequences: number;
  preemptedSequences: number;
  /** Positions of the running sequences whose K/V are in the cache. */
  cachedTokens: number;
  maxSequences: number;
  maxSequenceLength: number;
  blockSize: number;
  numBlocks: number;
  /** numBlocks x blockSize: no request needing more positions can run. */
  capacityTokens: number;
  /** Blocks some sequence holds. */
  blocksInUse: number;
  /** Blocks nobody holds that keep a finished sequence's prefix (reused, or taken when needed). */
  blocksCached: number;
  /** blocksInUse / numBlocks. */
  cacheUsage: number;
  /** Hybrid models only: their per-sequence state slots. */
  state?: StateSlotStats;
  /**
   * Since creation: sequences preempted; prompt positions computed (those of preempted sequences
   * computed again included); positions taken from blocks other sequences computed.
   */
  preemptions: number;
  prefillTokens: number;
  prefixHitTokens: number;
  /** CUDA graphs of the decode step captured so far. */
  cudaGraphs: number;
  /** Why decode steps run eagerly, op by op ('' while CUDA graphs serve them). */
  eagerReason: string;
  /** Where the steps' time went since creation. */
  times: StepTimes;
}

/** The state slots of a hybrid model's cache (native/src/state_slots.h). */
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

/** Seconds since a generator's creation, on the host's clock unless said (native/src/generation.h). */
export interface StepTimes {
  /** `step` calls that ran something, and the forwards they ran (several per call with maxSteps). */
  calls: number;
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

/** LoRA projection names (HF module names inside a block). */
export type LoraTarget = Projection;

export interface LoraOptions {
  rank: number;
  alpha: number;
  /** On each adapter's input, training only; masks come from the trainer's (checkpointed) RNG. Default 0. */
  dropout?: number;
  targetModules: LoraTarget[];
}

export interface TrainerOptions extends AdamWOptions {
  /**
   * Low-rank adapters y = W x + (alpha / rank) B A dropout(x) on the target projections, A
   * initialised like PEFT (kaiming-uniform), B = 0; the base weights stay frozen and AdamW
   * updates only the adapters.
   */
  lora?: LoraOptions;
  /**
   * Keep a frozen copy of the weights as they are at creation: the reference policy of the KL
   * term (`klBeta`). Create the trainer on the base weights (before `load`), so a resumed run
   * gets the same reference. With LoRA the reference is always the base model (no copy).
   */
  reference?: boolean;
  /** Seed of the trainer's RNG (LoRA init and dropout). Default 0. */
  seed?: number;
  /**
   * bf16 mixed precision: matmuls and attention in bf16 under libtorch's autocast, as
   * torch.autocast(dtype=torch.bfloat16) does, while the parameters (master weights), their
   * gradients, the AdamW state and the LM head's log-softmax stay fp32. Needs a float32 model.
   * Meant for CUDA (on a CPU it runs, slower than fp32). Absent: all in the model's dtype.
   */
  mixedPrecision?: 'bfloat16';
  /**
   * Activation checkpointing of every N-th decoder layer (layers 0, N, 2N, ...): their forward
   * keeps only its input, and the backward runs them again (same LoRA dropout masks, same
   * autocast). Less activation memory for long rows, for about one more forward of those layers.
   * Dense models; 0 or absent = off.
   */
  activationCheckpointing?: number;
}

export type Reals = Float32Array | Float64Array | number[];

/**
 * A packed row for training; `lossMask[t]` marks token t as trained on. The policy losses also
 * need, per token, `advantages[t]` and `inferenceLogprobs[t]` (mu, the logprob the inference
 * engine reported for token t; any value where lossMask is 0).
 */
export interface TrainRow extends PackedRow {
  lossMask: Uint8Array | boolean[] | number[];
  advantages?: Reals;
  inferenceLogprobs?: Reals;
  /**
   * MoE router replay: per token, per sparse layer in order, the numExpertsPerTok experts the
   * token was routed to at inference ([tokens, sparse layers, K] flattened). The sparse blocks
   * send the token to these experts (weighted by the router's current probabilities of them)
   * instead of the router's own top-k. Absent = the router decides.
   */
  routes?: Int32Array | number[];
  /**
   * Cross-entropy weight of each token (>= 0; 0 = none): the ce component trained beside the
   * policy loss (echo's observation tokens, an sft-distilled teacher's tokens), normalised by the
   * step's tokens with a weight above 0. Absent = none.
   */
  ceWeights?: Reals;
}

/**
 * The training objective. `kind` names a loss of the native registry (`LOSS_KINDS` in
 * ./loss-kinds); its unit native/src/loss_<kind>.cc says exactly what it computes per loss token,
 * with logp the trainer's logprob under softmax(logits / temperature), mu the inference logprob,
 * r = exp(logp - mu) and A the advantage. `params` are its parameters by config key (an absent one
 * takes the registry default).
 * Mismatch correction (`mismatch.mode`) on the detached r multiplies each token's policy term
 * (not dppo's and ipo's kl_tau term, which stays on every loss token): 'tis' by min(r, tisCap);
 * 'mask' zeroes tokens with r outside [tokenLow, tokenHigh] and whole samples whose
 * geometric-mean r is outside [seqLow, seqHigh]. Masked tokens still count in the normaliser
 * (as prime-rl: the loss is scaled down, not re-weighted onto the remaining tokens).
 * klBeta > 0 adds klBeta * k3 per loss token, k3 = exp(ref - logp) - (ref - logp) - 1 against
 * the trainer's reference policy (see TrainerOptions.reference), unaffected by mismatch masking.
 */
export interface LossConfig {
  /** Default 'ce'. */
  kind?: LossKindName;
  /** Logits are divided by it before log-softmax (the sampling temperature). Default 1. */
  temperature?: number;
  /**
   * 'token' (default): sum of token losses / loss tokens of the step. 'sequence': mean within
   * each sample, summed / samples (with at least one loss token) of the step.
   */
  normalization?: 'token' | 'sequence';
  /**
   * The step's count of the normalisation unit (loss tokens, or samples) when one optimizer
   * step is split over several calls. Default: counted over this call's rows.
   */
  normalizer?: number;
  /** The step's tokens with a ce weight above 0, when one step is split over several calls (as normalizer). */
  ceNormalizer?: number;
  /** The kind's parameters; a key the kind does not have is an error. */
  params?: Partial<Record<LossParamName, number>>;
  /** Trainer/inference mismatch correction; default none. Only for the policy losses. */
  mismatch?: MismatchCorrection;
  /** Default 0 (no KL term). */
  klBeta?: number;
  /**
   * MoE: weight of the router's load-balancing loss (transformers' load_balancing_loss_func,
   * over each row's sparse layers), added to the loss (and to the reported `loss`). Default 0 (still reported).
   */
  routerAuxLossCoef?: number;
}

export interface MismatchCorrection {
  mode: 'none' | 'tis' | 'mask';
  /** tis: default 2. */
  tisCap?: number;
  /** mask: defaults 0.125 and 8. */
  tokenLow?: number;
  tokenHigh?: number;
  /** mask: defaults 0.1 and 10. */
  seqLow?: number;
  seqHigh?: number;
}

/**
 * Metrics by name, in the order the engine computed them: the names a run records (metrics.jsonl).
 * The engine says what each is where it computes it: native/src/loss.cc `lossMetrics` (loss,
 * entropy, mismatch_kl, masked_*, clipped, kl_divergence, loss_tokens, loss_samples; means over
 * loss tokens), native/src/trainer.cc (tokens, grad_norm, tokens_per_s; MoE models:
 * router_aux_loss, expert_load_max, expert_load_mean).
 */
export type StepMetrics = Record<string, number>;

export interface TrainStepOptions {
  lr: number;
  /** Clip the total gradient norm to this; 0 or absent = no clipping. */
  maxGradNorm?: number;
  loss?: LossConfig;
  /**
   * Profile this step: writes `<profile>.txt` (wall and device-busy time, time by CUDA kernel and by
   * operator) and `<profile>.json` (the trace). native/src/profile.h.
   */
  profile?: string;
}

export interface TrainStepStats extends TrainStepFields {
  metrics: StepMetrics;
}

/** Inputs of `policyLoss`: per-token vectors of one equal length, samples back to back. */
export interface PolicyLossInputs {
  logp: Reals;
  lossMask: Uint8Array | boolean[] | number[];
  /** Token counts of the samples, in order; they sum to the vector length. */
  sampleLengths: number[];
  /** Default 0s. */
  mu?: Reals;
  advantages?: Reals;
  refLogp?: Reals;
  /** Cross-entropy weights (TrainRow.ceWeights); absent = no ce component. */
  ceWeights?: Reals;
}

export interface PolicyLossResult {
  loss: number;
  /** d loss / d logp per token. */
  gradLogp: Float64Array;
  metrics: StepMetrics;
}

/** `NativeModel.statePathCheck`'s sequence and how it is cut (native/src/state_check.h). */
export interface StatePathOptions {
  prompt: number[];
  /** Positions per prefill chunk (default 32). */
  prefillChunk?: number;
  /** The snapshot's position inside the prompt (default 16). */
  snapshotAt?: number;
  /** The paged cache's block size (default 16). */
  blockSize?: number;
  /** Greedy decode steps after the prompt (default 8). */
  greedySteps?: number;
}

/** Largest absolute differences of hidden states from the packed forward, and the greedy tokens. */
export interface StatePathResult {
  prefillDiff: number;
  snapshotDiff: number;
  decodeDiff: number;
  greedy: number[];
}

export interface NativeInfo {
  torchVersion: string;
  cuda: boolean;
  /** ATen (OpenMP) intra-op threads. */
  threads: number;
  /** OpenBLAS's own thread pool size, when libtorch uses OpenBLAS. */
  blasThreads?: number;
  /** The kernels OpenBLAS runs (`openblas_get_corename`), when libtorch's BLAS is OpenBLAS. */
  blasCore?: string;
  /** The library file that defines the BLAS sgemm_ ATen calls (Debian: libblas.so.3, OpenBLAS behind it). */
  blas?: string;
  /** The instruction set of the engine's own CPU loops (native/src/cpu_kernels.h): default, avx2, avx512. */
  cpuKernels: string;
  /** Whether the CPU multiplies bf16 itself (AVX-512 BF16 or AMX): bf16 matmuls then run in bf16. */
  cpuBf16Dot: boolean;
  parallelInfo: string;
  /** Whether the build has c10d's Gloo process group (the data-parallel trainer, `createGroup`). */
  gloo: boolean;
  /** Whether the build has our fused CUDA kernels (`ModelOptions.fusedKernels` on CUDA). */
  cudaKernels: boolean;
  /** Whether the build has c10d's NCCL process group (PyTorch 2.x with CUDA): `trainer.dist.backend`. */
  nccl: boolean;
  /**
   * Whether the trainer's store listens on `trainer.dist.host` only (PyTorch >= 2.2); libtorch
   * 1.13's listens on every interface, and lib/trainer/group.ts's signatures are what guard it.
   */
  storeBindsHost: boolean;
  /** CUDA devices the addon sees (0 without CUDA). */
  cudaDevices: number;
}

// ------------------------------------------------------------------------------------------------
// The raw addon (untyped at the boundary; typed here).

interface RawModel {
  score(rows: PackedRow[], opts: { temperature?: number }): Promise<RowScores[]>;
  loadWeights(tensors: readonly WeightTensor[], opts: { strict: boolean }): Promise<void>;
  readWeights(dtype?: TensorDType): Promise<WeightTensor[]>;
  numParameters(): number;
  createGenerator(opts: GeneratorOptions): RawGenerator;
  createTrainer(opts: TrainerOptions): RawTrainer;
  statePathCheck(opts: StatePathOptions): Promise<StatePathResult>;
}
interface RawGenerator {
  add(requests: GenerationRequest[]): Promise<AddedSequence[]>;
  step(maxSteps?: number): Promise<StepToken[]>;
  remove(seqIds: number[]): Promise<boolean[]>;
  stats(): CacheStats;
}
interface RawTrainer {
  step(rows: TrainRow[], opts: TrainStepOptions): Promise<TrainStepStats>;
  gradients(rows: TrainRow[], loss?: LossConfig): Promise<TrainStepStats & { gradients: WeightTensor[] }>;
  score(rows: PackedRow[], opts: { temperature?: number }): Promise<RowScores[]>;
  readWeights(dtype?: TensorDType): Promise<WeightTensor[]>;
  readAdapters(dtype?: TensorDType): Promise<WeightTensor[]>;
  save(dir: string): Promise<void>;
  load(dir: string): Promise<void>;
  resetOptimizer(): Promise<void>;
  stepCount(): number;
  setGroup(group: DistGroup, opts: GroupOptions): void;
  weightUnits(): number;
  readWeightUnit(unit: number, dtype?: TensorDType): Promise<WeightTensor[]>;
  shardLayout(): ShardLayout;
  readShard(unit: number): Promise<WeightTensor[]>;
  stageShard(unit: number, tensors: WeightTensor[]): Promise<void>;
  memory(): Promise<TrainerMemory>;
  loadBaseShard(unit: number, parts: { offset: number; tensor: WeightTensor }[]): Promise<void>;
}
interface Addon {
  info(): NativeInfo;
  setThreads(n: number): void;
  setCpuCache(capacityBytes: number): void;
  cpuCacheStats(): CpuCacheStats;
  createModel(
    config: EngineConfig,
    specs: readonly EngineTensorSpec[],
    tensors: readonly WeightTensor[],
    opts: ModelOptions & { withoutWeights?: boolean },
  ): Promise<RawModel>;
  matmulGflops(n: number, iters: number, m?: number, k?: number, dtype?: ComputeDType): Promise<number>;
  policyLoss(inputs: PolicyLossInputs, loss: LossConfig): PolicyLossResult;
  lmHeadCheck(options: LmHeadCheckOptions): LmHeadCheckResult;
  kernelCheck(options: KernelCheckOptions): KernelCheckOutput[];
  pagedDecodePlan(shape: PagedDecodeShape): PagedDecodePlan;
  kernelTime(options: KernelCheckOptions & { iters: number }): Promise<{ fused: number; unfused: number }>;
  cpuKernelCheck(seed: number): CpuKernelCheckRow[];
  adamwCheck(options: AdamwCheckOptions): { maxDiff: number; moved: number };
  lossKinds(): LossKindSpec[];
  layerSlots(): string[];
  engineTypes(): Record<string, EngineFieldDecl[]>;
  createStore(opts: DistStoreOptions): Promise<DistStore>;
  createGroup(store: DistStore, opts: DistGroupOptions): Promise<DistGroup>;
  collectiveTime(group: DistGroup, opts: CollectiveTimeOptions): Promise<CollectiveTiming>;
  /** Test-only entry points: native/testing.ts types them. */
  testing: unknown;
}

/** Drops tensors checkpoints may carry that the model does not use (`ModelBinding.ignorable`). */
function withoutIgnorable(tensors: readonly WeightTensor[], binding: ModelBinding): readonly WeightTensor[] {
  return tensors.some((t) => binding.ignorable(t.name)) ? tensors.filter((t) => !binding.ignorable(t.name)) : tensors;
}

/** The repository root: the nearest directory above this file holding package.json. */
function repoRoot(): string {
  let dir = __dirname;
  while (!fs.existsSync(path.join(dir, 'package.json'))) {
    const up = path.dirname(dir);
    if (up === dir) throw new Error(`prime_native: no package.json above ${__dirname}`);
    dir = up;
  }
  return dir;
}

let addon: Addon | undefined;
function load(): Addon {
  if (!addon) {
    // PRIME_NATIVE_ADDON: another build of the addon (e.g. the CUDA build, or a baseline to compare with).
    const file =
      process.env.PRIME_NATIVE_ADDON || path.join(repoRoot(), 'build', 'native', 'Release', 'prime_native.node');
    if (!fs.existsSync(file)) throw new Error(`prime_native: ${file} not found; run \`npm run build:native\``);
    chooseOpenBlasCore(); // before OpenBLAS loads with the addon: it picks its kernels then (blas-core.ts)
    addon = require(file) as Addon;
  }
  return addon;
}

// ------------------------------------------------------------------------------------------------
// Public API

/** @internal The addon's test-only entry points, for native/testing.ts alone. */
export function testingAddon(): unknown {
  return load().testing;
}

/** libtorch version, CUDA availability and the intra-op thread count. */
export function info(): NativeInfo {
  return load().info();
}

/**
 * Uses `n` threads for every later compute call. With a pthreads OpenBLAS (Debian libtorch) the
 * matmuls get n threads and ATen's OpenMP pool 1, as the two pools would fight over the cores.
 */
export function setThreads(n: number): void {
  load().setThreads(n);
}

/** The CPU caching allocator's counters (native/src/cpu_cache.h): large blocks reused or newly allocated. */
export interface CpuCacheStats {
  hits: number;
  misses: number;
  cachedBytes: number;
  capacityBytes: number;
}

/**
 * How many bytes of freed large CPU tensors (1 MiB and more) the engine keeps for reuse: 2 GiB
 * unless set. A step re-allocates the same large buffers (logits chunks, gradients), which would
 * otherwise go back to the kernel and be faulted in and zeroed again. 0 turns the cache off.
 */
export function setCpuCache(capacityBytes: number): void {
  load().setCpuCache(capacityBytes);
}

export function cpuCacheStats(): CpuCacheStats {
  return load().cpuCacheStats();
}

/** One of the engine's CPU loops on one problem against fp64 (native/src/cpu_kernel_check.h). */
export interface CpuKernelCheckRow {
  /** The instruction set of the copy that ran: default, avx2 or avx512 (each one this CPU runs). */
  isa: string;
  kernel: 'linear' | 'pagedAttention' | 'lmHeadRows';
  dtype: 'float32' | 'bfloat16';
  shape: string;
  /** Largest difference from the exact result, relative to its largest magnitude. */
  error: number;
}

/** Runs every CPU loop of every instruction set this CPU runs against fp64 on random inputs. */
export function cpuKernelCheck(seed = 0): CpuKernelCheckRow[] {
  return load().cpuKernelCheck(seed);
}

/** Measured fp32 throughput (GFLOP/s) of `iters` n x n matmuls: the yardstick of the benchmarks. */
export function matmulGflops(n = 2048, iters = 10): Promise<number> {
  return load().matmulGflops(n, iters);
}

/** Measured throughput (GFLOP/s) of `iters` projections as the model runs them: linear(x [m, k], w [n, k]). */
export function linearGflops(
  m: number,
  k: number,
  n: number,
  iters: number,
  dtype: ComputeDType = 'float32',
): Promise<number> {
  return load().matmulGflops(n, iters, m, k, dtype);
}

/**
 * Evaluates the trainer's loss code (fp64, synchronously) on given per-token logprobs: the loss,
 * d loss / d logp and the metrics. For tests against hand computation; the normaliser is
 * `loss.normalizer` or the counts of these inputs.
 */
export function policyLoss(inputs: PolicyLossInputs, loss: LossConfig): PolicyLossResult {
  return load().policyLoss(inputs, loss);
}

/** Shapes of `lmHeadCheck`'s random problem (drawn in fp64); the loss is sum(c1 * logp + c2 * entropy), c ~ U(0, w). */
export interface LmHeadCheckOptions {
  tokens: number;
  hidden: number;
  vocab: number;
  chunkTokens: number;
  /** How many leading chunks keep their logits for the backward (the rest are recomputed). */
  keepChunks: number;
  /** The chunked side's dtype (the reference is always fp64); default float64. */
  dtype?: 'float32' | 'float64';
  /** The tensor-op path that devices other than the CPU take, instead of the CPU's fused row kernels. */
  tensorOps?: boolean;
  temperature: number;
  wLogp: number;
  wEntropy: number;
  seed: number;
}
/** Largest absolute differences between the chunked LM head and the full-logits autograd graph. */
export interface LmHeadCheckResult {
  logp: number;
  entropy: number;
  gradHidden: number;
  gradWeight: number;
  /** Largest gradient entry of the reference, to tell a match from two zero gradients. */
  gradScale: number;
}
/** The chunked LM head (native/src/lm_head.h) checked against the plain graph, for tests. */
export function lmHeadCheck(options: LmHeadCheckOptions): LmHeadCheckResult {
  return load().lmHeadCheck(options);
}

/** A fused kernel's random problem (native/src/kernel_check.h): shapes by kernel. */
export interface KernelCheckOptions {
  kernel: 'rmsNorm' | 'addRmsNorm' | 'rope' | 'swiglu' | 'lmHead';
  /** The activations' dtype; bfloat16 runs as mixed precision (fp32 weights); float64 reaches the kernels' refusal. */
  dtype: ComputeDType;
  /**
   * rmsNorm, addRmsNorm, lmHead: the weight's dtype, float32 (default: master weights) or bfloat16
   * with bf16 activations (a bf16 model; what full sharding gathers).
   */
  weightDtype?: 'float32' | 'bfloat16';
  device: string;
  /** Tokens. */
  rows: number;
  /** The normed, intermediate or hidden size, or the head size (rope). */
  width: number;
  /** rmsNorm: [rows, heads, width] (the q/k norms); rope: q heads. Default 1. */
  heads?: number;
  /** rope: k heads. Default 1. */
  kvHeads?: number;
  vocab?: number;
  /** lmHead: tokens per chunk (0 = the device's default). */
  chunkTokens?: number;
  /** lmHead: the loss uses the entropy too (default true). */
  entropyGrad?: boolean;
  /** swiglu: gate and up as the halves of one [rows, 2 width] tensor (default false). */
  packed?: boolean;
  /** rmsNorm: the weight's size (default width; another size reaches the kernels' refusal). */
  weightWidth?: number;
  seed?: number;
}
/**
 * One output (`y`, `logp`, ...) or input gradient (`dx`, `dweight`, ...): the largest difference
 * from the unfused path run in fp64 on the CPU on the same rounded inputs, relative to that result's
 * largest magnitude (`scale`), for our fused path and libtorch's, and the two paths' difference.
 */
export interface KernelCheckOutput {
  name: string;
  fused: number;
  unfused: number;
  apart: number;
  scale: number;
}
/** One fused kernel against the libtorch path it replaces, forward and backward (synchronous). */
export function kernelCheck(options: KernelCheckOptions): KernelCheckOutput[] {
  return load().kernelCheck(options);
}
/** A model's attention shape as the paged decode kernel sees it. */
export interface PagedDecodeShape {
  heads: number;
  kvHeads: number;
  headDim: number;
  /** The longest context a decode step reads (positions). */
  maxKeys: number;
  /** Shared memory a block may opt in to on the device, bytes (default 48 KiB, what every device gives). */
  optInLimit?: number;
}
/** How the CUDA paged decode kernel lays out its blocks for a shape (native/src/paged_decode_plan.h). */
export interface PagedDecodePlan {
  /** Positions per partition (0 when the shape cannot be served). */
  partition: number;
  /** Shared memory per block, bytes. */
  sharedBytes: number;
  /** Above the plain 48 KiB: the launcher opts the kernel in. */
  optIn: boolean;
  /** Why the shape cannot be served ('' when it can). */
  why: string;
}
/** The paged decode kernel's plan for a shape, computed on the host (any build, no GPU needed). */
export function pagedDecodePlan(shape: PagedDecodeShape): PagedDecodePlan {
  return load().pagedDecodePlan(shape);
}
/** Seconds per forward + backward of the fused kernel and of the libtorch path, `iters` passes each. */
export function kernelTime(
  options: KernelCheckOptions & { iters: number },
): Promise<{ fused: number; unfused: number }> {
  return load().kernelTime(options);
}

/** `adamwCheck`'s random problem: a parameter of `numel` values and a non-contiguous 5 x 7 one. */
export interface AdamwCheckOptions {
  numel: number;
  steps: number;
  weightDecay: number;
  /** The clipping scale adamwStep applies; libtorch's AdamW gets gradients multiplied by it. */
  gradScale: number;
  dtype: 'float32' | 'float64';
  seed: number;
}
/** The fused AdamW step (native/src/adamw.h) against libtorch's AdamW: largest parameter difference, and how far libtorch moved them. */
export function adamwCheck(options: AdamwCheckOptions): { maxDiff: number; moved: number } {
  return load().adamwCheck(options);
}

/** The native loss registry as the addon has it (what loss-kinds.generated.ts must equal). */
export function lossKinds(): LossKindSpec[] {
  return load().lossKinds();
}

/** A fixed field the engine declares (engineTypes()); `default` where the engine has one. */
export interface EngineFieldDecl {
  name: string;
  doc: string;
  default?: number;
}

/** The engine's fixed N-API fields by TS interface (what engine-types.generated.ts must render). */
export function engineTypes(): Record<string, EngineFieldDecl[]> {
  return load().engineTypes();
}

/** The block slot names the engine fills from a tensor table (what `LAYER_SLOTS` must equal). */
export function layerSlots(): string[] {
  return load().layerSlots();
}

/**
 * A model of `binding` whose parameters have their shapes but no memory: a trainer made of it and
 * fully sharded (`setGroup`) fills its shards with `loadBaseShard`, so no rank ever holds the whole
 * model. It computes nothing otherwise.
 */
export async function createModelWithoutWeights(
  binding: ModelBinding,
  options: ModelOptions = {},
): Promise<NativeModel> {
  const raw = await load().createModel(binding.config, binding.specs, [], { ...options, withoutWeights: true });
  return new NativeModel(raw, binding, options.dtype ?? 'float32', options.device ?? 'cpu');
}

/**
 * Builds a model from named tensors (bytes are copied once and converted to the compute dtype).
 * Rejects on a missing, extra, mis-shaped or unsupported-dtype tensor, naming it.
 */
export async function createModel(
  binding: ModelBinding,
  tensors: readonly WeightTensor[],
  options: ModelOptions = {},
): Promise<NativeModel> {
  const raw = await load().createModel(binding.config, binding.specs, withoutIgnorable(tensors, binding), options);
  return new NativeModel(raw, binding, options.dtype ?? 'float32', options.device ?? 'cpu');
}

export class NativeModel {
  private readonly queue = new SerialQueue();

  /** @internal use createModel */
  constructor(
    private readonly raw: RawModel,
    private readonly binding: ModelBinding,
    readonly dtype: ComputeDType,
    readonly device: string,
  ) {}

  get numParameters(): number {
    return this.raw.numParameters();
  }

  /** Per-token logprobs and entropies of packed rows (see RowScores for the alignment). */
  score(rows: PackedRow[], options: { temperature?: number } = {}): Promise<RowScores[]> {
    return this.queue.run(() => this.raw.score(rows, options));
  }

  /**
   * Copies new values into the live weights (same names and shapes), e.g. for update_weights.
   * Strict (default): every parameter must be given. Validates everything before changing anything.
   */
  loadWeights(tensors: readonly WeightTensor[], options: { strict?: boolean } = {}): Promise<void> {
    const used = withoutIgnorable(tensors, this.binding);
    return this.queue.run(() => this.raw.loadWeights(used, { strict: options.strict ?? true }));
  }

  /** All weights by HF name, as bytes in `dtype` (default: the compute dtype's). */
  readWeights(dtype?: TensorDType): Promise<WeightTensor[]> {
    return this.queue.run(() => this.raw.readWeights(dtype));
  }

  /**
   * A hybrid model's paged forward with state slots checked against its packed forward
   * (native/src/state_check.h): chunked prefill with a snapshot, a prefix continued from the
   * snapshot, greedy decode steps. Throws for a model without Gated DeltaNet blocks.
   */
  statePathCheck(options: StatePathOptions): Promise<StatePathResult> {
    return this.queue.run(() => this.raw.statePathCheck(options));
  }

  /** A generator with its own KV cache; its calls share this model's queue. */
  createGenerator(options: GeneratorOptions): Generator {
    return new Generator(this.raw.createGenerator(options), this.queue);
  }

  /**
   * A trainer (AdamW) updating this model's weights in place (with LoRA: its adapters, the
   * weights stay as they are); needs float32/float64.
   */
  createTrainer(options: TrainerOptions = {}): Trainer {
    return new Trainer(this.raw.createTrainer(options), this.queue);
  }
}

/**
 * Batched generation over a paged KV cache. Sequences join with `add` (as many as the cache has
 * room for) and leave when finished (automatically) or with `remove`; every `step` computes a
 * decode row for each running sequence and prefill chunks of the sequences still reading their
 * prompt, in one batch.
 */
export class Generator {
  /** @internal use NativeModel.createGenerator */
  constructor(
    private readonly raw: RawGenerator,
    private readonly queue: SerialQueue,
  ) {}

  /**
   * Admits the longest leading run of the requests the cache has room for now (sequence slots,
   * the blocks of their prompts; none while preempted sequences wait) and returns their ids; the
   * others are for a later call. Rejects, admitting nothing, when a request is invalid or needs
   * more positions than the cache holds. Their tokens, the first included, come out of `step`.
   */
  add(requests: GenerationRequest[]): Promise<AddedSequence[]> {
    return this.queue.run(() => this.raw.add(requests));
  }

  /**
   * One step for every running sequence; finished ones free their blocks. With maxSteps > 1 and
   * nothing to prefill, up to maxSteps decode steps run in one call (tokens fed back on the
   * device, read once): a sequence's tokens are the same either way.
   */
  step(maxSteps = 1): Promise<StepToken[]> {
    return this.queue.run(() => this.raw.step(maxSteps));
  }

  /** Aborts sequences (running or preempted) and frees their blocks; false for ids not active. */
  remove(seqIds: number[]): Promise<boolean[]> {
    return this.queue.run(() => this.raw.remove(seqIds));
  }

  /** The cache's state and counters, as of the last completed call. */
  stats(): CacheStats {
    return this.raw.stats();
  }
}

/** Training on packed rows with gradient accumulation, clipping and AdamW. */
export class Trainer {
  /** @internal use NativeModel.createTrainer */
  constructor(
    private readonly raw: RawTrainer,
    private readonly queue: SerialQueue,
  ) {}

  /** One optimizer step over all rows (micro-batches): forward+backward each, clip, AdamW at `lr`. */
  step(rows: TrainRow[], options: TrainStepOptions): Promise<TrainStepStats> {
    return this.queue.run(() => this.raw.step(rows, options));
  }

  /**
   * Loss and gradients of the trained parameters (HF names; LoRA: the adapters' PEFT names)
   * without updating anything: for gradient checks and debugging.
   */
  gradients(rows: TrainRow[], loss?: LossConfig): Promise<TrainStepStats & { gradients: WeightTensor[] }> {
    return this.queue.run(() => this.raw.gradients(rows, loss));
  }

  /** Per-token logprobs and entropies under the policy being trained (LoRA applied, no dropout). */
  score(rows: PackedRow[], options: { temperature?: number } = {}): Promise<RowScores[]> {
    return this.queue.run(() => this.raw.score(rows, options));
  }

  /**
   * The trained policy's weights by HF name, for inference (`loadWeights`, safetensors): the
   * model's weights, or with LoRA the merged W + (alpha / rank) B A.
   */
  readWeights(dtype?: TensorDType): Promise<WeightTensor[]> {
    return this.queue.run(() => this.raw.readWeights(dtype));
  }

  /**
   * LoRA adapters by PEFT name (`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`,
   * `...lora_B.weight`), A [rank, in], B [out, rank]; empty without LoRA.
   */
  readAdapters(dtype?: TensorDType): Promise<WeightTensor[]> {
    return this.queue.run(() => this.raw.readAdapters(dtype));
  }

  /**
   * Writes `dir/trainer.ckpt` atomically: the trained parameters (all weights, or the LoRA
   * adapters), AdamW state, step count and the trainer's RNG state.
   */
  save(dir: string): Promise<void> {
    return this.queue.run(() => this.raw.save(dir));
  }

  /** Restores a checkpoint written by `save`; rejects (changing nothing) if it is corrupt or incompatible. */
  load(dir: string): Promise<void> {
    return this.queue.run(() => this.raw.load(dir));
  }

  /** AdamW afresh (its moments at zero), the weights as they are: a resume with ckpt.skip_optimizer. */
  resetOptimizer(): Promise<void> {
    return this.queue.run(() => this.raw.resetOptimizer());
  }

  /** Optimizer steps taken (restored by `load`). */
  get stepCount(): number {
    return this.raw.stepCount();
  }

  /**
   * Data parallel from now on (before any step or load): `step` sums the loss normaliser, metrics
   * and gradients over the group's ranks, each calling `step` with its share of the rows.
   * - sharding `optimizer` (ZeRO-1): gradients all-reduced in buckets of `bucketBytes`; each rank
   *   steps the parameters it owns, then broadcasts them. `save` is then a collective: rank 0
   *   writes the whole state, other ranks only send theirs (their `dir` is ignored); `load` keeps
   *   this rank's shard of a whole checkpoint.
   * - sharding `full`: parameters, gradients and AdamW state are sharded (native/src/fsdp.h), and
   *   every call that computes (step, gradients, score, readWeightUnit) is a collective. Full
   *   fine-tuning checkpoints are sharded: each rank writes its `readShard` units, then `save`
   *   (lib/trainer/shards.ts); `stageShard` before `load` reads them back at any world size.
   */
  setGroup(group: DistGroup, opts: GroupOptions): void {
    this.raw.setGroup(group, opts);
  }

  /** The units `readWeightUnit` reads: the embedding, each decoder layer, the final norm, an untied head. */
  get weightUnits(): number {
    return this.raw.weightUnits();
  }

  /**
   * `readWeights` of one unit: its policy weights by HF name (with LoRA merged), gathered from the
   * ranks under full sharding (a collective: every rank reads every unit, in order).
   */
  readWeightUnit(unit: number, dtype?: TensorDType): Promise<WeightTensor[]> {
    return this.queue.run(() => this.raw.readWeightUnit(unit, dtype));
  }

  /** The units of the model's parameters, their flat layout, and this trainer's share of them. */
  shardLayout(): ShardLayout {
    return this.raw.shardLayout();
  }

  /** This rank's shard of a unit (full sharding): `param`, `exp_avg`, `exp_avg_sq`, 1-D each. */
  readShard(unit: number): Promise<WeightTensor[]> {
    return this.queue.run(() => this.raw.readShard(unit));
  }

  /** A unit's `[param, exp_avg, exp_avg_sq]` over this trainer's range of it, for the next `load`. */
  stageShard(unit: number, tensors: WeightTensor[]): Promise<void> {
    return this.queue.run(() => this.raw.stageShard(unit, tensors));
  }

  /**
   * A model made by `createModelWithoutWeights`, fully sharded: parts of unit `unit`'s base
   * weights, each `tensor` (1-D, any float dtype) elements [offset, offset + its length) of the
   * unit's flat layout (`shardLayout`); this rank keeps those in its range.
   */
  loadBaseShard(unit: number, parts: { offset: number; tensor: WeightTensor }[]): Promise<void> {
    return this.queue.run(() => this.raw.loadBaseShard(unit, parts));
  }

  /** The bytes this trainer (rank) holds, from its own tensors. */
  memory(): Promise<TrainerMemory> {
    return this.queue.run(() => this.raw.memory());
  }
}

/** What data-parallel ranks shard: AdamW's state (ZeRO-1), or parameters, gradients and state alike. */
export type Sharding = 'optimizer' | 'full';

export interface GroupOptions {
  /** ZeRO-1's gradient all-reduce bucket. */
  bucketBytes: number;
  /** Default `optimizer`. */
  sharding?: Sharding;
}

/** How the model's parameters lie in units (native/src/fsdp.h `ShardPlan`) and what this trainer holds of them. */
export interface ShardLayout {
  /** Whether this trainer shards the model's (trainable) parameters: full sharding, full fine-tuning. */
  sharded: boolean;
  /** Sharded trainers: the group's size and this rank; others hold whole units (1, 0). */
  worldSize: number;
  rank: number;
  /** The master weights' dtype (F32, or F64 for fp64 models). */
  dtype: TensorDType;
  units: {
    name: string;
    numel: number;
    /** Back to back in the unit's flat buffer. */
    params: { name: string; shape: number[]; offset: number }[];
  }[];
}

/** Bytes one trainer (rank) holds: its parameters (or shards), gradients, AdamW state; peak of gathered buffers. */
export interface TrainerMemory {
  parameterBytes: number;
  gradientBytes: number;
  optimizerBytes: number;
  /** Full sharding: the most bytes of gathered parameters held at once since the last call. */
  gatheredPeakBytes: number;
}

/** A c10d TCPStore: rank 0 serves it, the other ranks connect (the trainer's rendezvous). */
export interface DistStoreOptions {
  host: string;
  /** 0 with isServer: any free port (see `port()`). */
  port: number;
  isServer?: boolean;
  /** A client gives up connecting after this long. */
  timeoutS: number;
}

export interface DistStore {
  set(key: string, value: string): Promise<void>;
  /** The value of `key`, or null when it is not set within `timeoutMs`; rejects when the store is gone. */
  get(key: string, timeoutMs: number): Promise<string | null>;
  add(key: string, delta: number): Promise<number>;
  port(): number;
}

export interface DistGroupOptions {
  /** Keys of this group in the store: a fresh prefix per group, so it never meets an older one's. */
  prefix: string;
  rank: number;
  size: number;
  /** Forming the group and every collective fail after this long without progress. */
  timeoutS: number;
  /** What moves CUDA tensors: NCCL (`auto` where the build has it) or Gloo; CPU tensors always go over Gloo. */
  backend?: DistBackend;
}

export type DistBackend = 'auto' | 'gloo' | 'nccl';

/** A process group (opaque: `Trainer.setGroup` uses it). */
export type DistGroup = { readonly __brand: 'DistGroup' };

/** Connects to (or, isServer, serves) a c10d TCP store. */
export function createStore(opts: DistStoreOptions): Promise<DistStore> {
  return load().createStore(opts);
}

/** Joins a Gloo process group through `store`; resolves once all `size` ranks have joined. */
export function createGroup(store: DistStore, opts: DistGroupOptions): Promise<DistGroup> {
  return load().createGroup(store, opts);
}

/**
 * Rank `root`'s bytes into every rank's `buffers`, in place (a collective: every rank of `group`
 * calls it with buffers of the same sizes, in the same order). In buckets of at most `bucketBytes`;
 * through device memory on a CUDA `device` (NCCL where the build has it), else over Gloo.
 */
export function broadcastBuffers(
  group: DistGroup,
  buffers: Buffer[],
  opts: { root: number; bucketBytes: number; device?: string },
): Promise<void> {
  return (
    group as unknown as { broadcast(b: Buffer[], root: number, bucket: number, device: string): Promise<void> }
  ).broadcast(buffers, opts.root, opts.bucketBytes, opts.device ?? 'cpu');
}

export interface CollectiveTimeOptions {
  /** Where the tensors live: CUDA tensors move over the group's NCCL (or Gloo), CPU ones over Gloo. */
  device: string;
  /** Bytes each rank contributes to an all-gather. */
  bytes: number;
  iters: number;
}
/** What a group's collectives cost, timed as the trainer's are (`TrainStepStats.commSeconds`). */
export interface CollectiveTiming {
  /** While some collective ran (NCCL: on its stream, by its events). */
  busySeconds: number;
  /** While the work waiting for them stood still (Gloo: the host thread; NCCL: the waiting stream). */
  waitSeconds: number;
  collectives: number;
}
/**
 * `iters` all-gathers of `bytes` per rank issued back to back, then waited for in order (every
 * rank of the group calls it together): the group's collective timing, measured.
 */
export function collectiveTime(group: DistGroup, opts: CollectiveTimeOptions): Promise<CollectiveTiming> {
  return load().collectiveTime(group, opts);
}
