/**
 * Training on packed rows (native/src/addon/trainer_wrap.cc): gradient accumulation, clipping,
 * AdamW, LoRA, checkpoints, and data parallel over a process group (ZeRO-1 or full sharding). Its
 * options and a step's fixed fields are the engine's X-macro lists (native/src/trainer.h,
 * native/src/loss.h), generated into engine-types.generated.ts.
 */
import { loadAddon } from './addon';
import type { DistGroup } from './dist';
import type {
  AdamWOptions,
  LossNormalization,
  MismatchBounds,
  MismatchMode,
  Sharding,
  TrainStepFields,
} from './engine-types.generated';
import type { LossKindName, LossParamName } from './loss-kinds';
import type { Projection, TensorDType, WeightTensor } from './model-binding';
import type { PackedRow, Reals, RowScores } from './rows';
import type { SerialQueue } from './serial';

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
  normalization?: LossNormalization;
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

/** Trainer/inference mismatch correction (native/src/loss.h): the mode, and its bounds (defaults in MISMATCH_DEFAULTS). */
export interface MismatchCorrection extends MismatchBounds {
  mode: MismatchMode;
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

/** @internal The addon's trainer object. */
export interface RawTrainer {
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

/** What rank `rank` of `worldSize` holds of a unit under full sharding (`shardRange`). */
export interface ShardRange {
  /** Elements [begin, end) of the unit's flat buffer (ShardLayout's params lie in it at their offsets). */
  begin: number;
  end: number;
  /** Every rank's shard of the unit: elements of the unit, then zeros past its end. */
  shardNumel: number;
}

/**
 * Full sharding's layout rule (native/src/fsdp.h `ShardPlan::shardRange`, its one description):
 * the part of a unit of `numel` elements that rank `rank` of `worldSize` holds.
 */
export function shardRange(numel: number, rank: number, worldSize: number): ShardRange {
  return loadAddon<{ shardRange(numel: number, rank: number, worldSize: number): ShardRange }>().shardRange(
    numel,
    rank,
    worldSize,
  );
}
