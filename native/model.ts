/**
 * A model loaded into the engine (native/src/addon/model_wrap.cc): scoring, its weights, and the
 * generators and trainers made from it. Its calls and theirs are queued and run one at a time, each
 * on a libuv worker thread (a Promise), so the event loop stays responsive.
 */
import { loadAddon } from './addon';
import type { GeneratorOptions } from './engine-types.generated';
import { Generator, type RawGenerator } from './generator';
import type { EngineConfig, EngineTensorSpec, ModelBinding, TensorDType, WeightTensor } from './model-binding';
import type { PackedRow, RowScores } from './rows';
import { SerialQueue } from './serial';
import { Trainer, type RawTrainer, type TrainerOptions } from './trainer';

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

/** The addon's model object (native/src/addon/model_wrap.cc). */
interface RawModel {
  score(rows: PackedRow[], opts: { temperature?: number }): Promise<RowScores[]>;
  loadWeights(tensors: readonly WeightTensor[], opts: { strict: boolean }): Promise<void>;
  readWeights(dtype?: TensorDType): Promise<WeightTensor[]>;
  numParameters(): number;
  createGenerator(opts: GeneratorOptions): RawGenerator;
  createTrainer(opts: TrainerOptions): RawTrainer;
}
interface ModelAddon {
  createModel(
    config: EngineConfig,
    specs: readonly EngineTensorSpec[],
    tensors: readonly WeightTensor[],
    opts: ModelOptions & { withoutWeights?: boolean },
  ): Promise<RawModel>;
}
const addon = () => loadAddon<ModelAddon>();

/** Drops tensors checkpoints may carry that the model does not use (`ModelBinding.ignorable`). */
function withoutIgnorable(tensors: readonly WeightTensor[], binding: ModelBinding): readonly WeightTensor[] {
  return tensors.some((t) => binding.ignorable(t.name)) ? tensors.filter((t) => !binding.ignorable(t.name)) : tensors;
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
  const raw = await addon().createModel(binding.config, binding.specs, [], { ...options, withoutWeights: true });
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
  const raw = await addon().createModel(binding.config, binding.specs, withoutIgnorable(tensors, binding), options);
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
