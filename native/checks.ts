/**
 * The engine's test-only and benchmark entry points (native/src/addon/functions.cc), apart from the
 * production facade (index.ts): its parts checked against the libtorch paths they replace (kernels,
 * the chunked LM head, AdamW, a hybrid model's state path), the loss code on given inputs, the
 * registries and declared facts the generated TS files must equal, and yardsticks (matmul
 * throughput, collective timing). Imported by test/ and bench/ only.
 */
import { loadAddon } from './addon';
import type { DistGroup } from './dist';
import type { LossKindSpec } from './loss-kinds';
import { modelInternals } from './internals';
import type { ComputeDType, NativeModel } from './model';
import type { Reals } from './rows';
import type { LossConfig, StepMetrics } from './trainer';

interface ChecksAddon {
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
  engineTypes(): EngineTypes;
  collectiveTime(group: DistGroup, opts: CollectiveTimeOptions): Promise<CollectiveTiming>;
}
const addon = () => loadAddon<ChecksAddon>();

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

/** `statePathCheck`'s sequence and how it is cut (native/src/state_check.h). */
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
  return addon().cpuKernelCheck(seed);
}

/** Measured fp32 throughput (GFLOP/s) of `iters` n x n matmuls: the yardstick of the benchmarks. */
export function matmulGflops(n = 2048, iters = 10): Promise<number> {
  return addon().matmulGflops(n, iters);
}

/** Measured throughput (GFLOP/s) of `iters` projections as the model runs them: linear(x [m, k], w [n, k]). */
export function linearGflops(
  m: number,
  k: number,
  n: number,
  iters: number,
  dtype: ComputeDType = 'float32',
): Promise<number> {
  return addon().matmulGflops(n, iters, m, k, dtype);
}

/**
 * Evaluates the trainer's loss code (fp64, synchronously) on given per-token logprobs: the loss,
 * d loss / d logp and the metrics. For tests against hand computation; the normaliser is
 * `loss.normalizer` or the counts of these inputs.
 */
export function policyLoss(inputs: PolicyLossInputs, loss: LossConfig): PolicyLossResult {
  return addon().policyLoss(inputs, loss);
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
  return addon().lmHeadCheck(options);
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
  return addon().kernelCheck(options);
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
  return addon().pagedDecodePlan(shape);
}
/** Seconds per forward + backward of the fused kernel and of the libtorch path, `iters` passes each. */
export function kernelTime(
  options: KernelCheckOptions & { iters: number },
): Promise<{ fused: number; unfused: number }> {
  return addon().kernelTime(options);
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
  return addon().adamwCheck(options);
}

/** The native loss registry as the addon has it (what loss-kinds.generated.ts must equal). */
export function lossKinds(): LossKindSpec[] {
  return addon().lossKinds();
}

/** The block slot names the engine fills from a tensor table (what `LAYER_SLOTS` must equal). */
export function layerSlots(): string[] {
  return addon().layerSlots();
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
  return addon().collectiveTime(group, opts);
}

/**
 * A hybrid model's paged forward with state slots checked against its packed forward
 * (native/src/state_check.h): chunked prefill with a snapshot, a prefix continued from the
 * snapshot, greedy decode steps. Throws for a model without Gated DeltaNet blocks.
 */
export function statePathCheck(model: NativeModel, options: StatePathOptions): Promise<StatePathResult> {
  const { raw, queue } = modelInternals(model);
  const checked = raw as { statePathCheck(o: StatePathOptions): Promise<StatePathResult> };
  return queue.run(() => checked.statePathCheck(options));
}

/** A field's default as the engine declares it: a number, a boolean, an enum value's name. */
export type EngineFieldValue = number | boolean | string;

/** A field of an X-macro list (native/src/facts.h); `default` where the engine has one (the field is then optional). */
export interface EngineFieldDecl {
  name: string;
  /** Its TS type: number, boolean, or an enum's type name. */
  type: string;
  doc: string;
  default?: EngineFieldValue;
}

/** What the engine declares (engineTypes()): what engine-types.generated.ts must render. */
export interface EngineTypes {
  /** Each enum: its TS type, the name of its value list, its values in order. */
  enums: { type: string; list: string; values: string[] }[];
  /** Each struct: its TS interface, the name of the const of its defaults (if any), its fields. */
  interfaces: { name: string; defaults?: string; fields: EngineFieldDecl[] }[];
}

/** The engine's facts declared as X-macro lists (native/src/facts.h). */
export function engineTypes(): EngineTypes {
  return addon().engineTypes();
}
