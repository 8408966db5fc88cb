/**
 * The shared decoder skeleton (pre-norm blocks: RMSNorm, GQA attention with RoPE, SwiGLU MLP) and
 * the interface every architecture family implements over it. The native engine knows only the
 * skeleton's slots (`native/src/model.h`: `Layer` fields, embed/norm/lmHead); which HF tensor
 * fills which slot is declared here, in TS, and handed to the engine with the weights.
 */
import type { ArchConfig, LayerType, LinearAttentionConfig, MoeConfig } from '../arch';
import type { ConfigReader, Json } from '../config-reader';

/** Slots outside the blocks. */
export type ModelSlot = 'embed' | 'norm' | 'lmHead';
/**
 * Slots of one block (native `Layer` fields); biases and q/k norms are optional. The engine names
 * the same slots (`native/src/model.cc` `kLayerSlots` and `kExpertSlots`): test/model.families.test.ts
 * checks the two lists are equal.
 */
export const LAYER_SLOTS = [
  'inputNorm',
  'q',
  'k',
  'v',
  'o',
  'qBias',
  'kBias',
  'vBias',
  'oBias',
  'qNorm',
  'kNorm',
  'postNorm',
  'gate',
  'up',
  'down',
  // A sparse MoE block's router [experts, D] and its experts' projections (one tensor per expert).
  'router',
  'expertGate',
  'expertUp',
  'expertDown',
  // Qwen3.5-MoE's shared expert beside the routed ones, and its gate [1, D].
  'sharedGate',
  'sharedUp',
  'sharedDown',
  'sharedExpertGate',
  // A Gated DeltaNet block (Qwen3.5) instead of attention: in_proj_qkv [2 Hk dk + Hv dv, D],
  // in_proj_z [Hv dv, D], in_proj_b and in_proj_a [Hv, D], the depthwise conv1d [2 Hk dk + Hv dv, 1,
  // kernel], dt_bias and A_log [Hv], the gated RMSNorm [dv] and out_proj [D, Hv dv].
  'linQkv',
  'linZ',
  'linB',
  'linA',
  'linConv',
  'linDtBias',
  'linALog',
  'linNorm',
  'linOut',
] as const;
export type LayerSlot = (typeof LAYER_SLOTS)[number];

/**
 * How `model create` initialises a tensor (transformers' `_init_weights`): normal(0, 0.02)
 * (embedding, linear), zeros (bias; normOffset, an RMSNorm weight stored as an offset from 1),
 * ones (norm, ones), log(uniform(0.01, 16)) (decayLog: Gated DeltaNet's A_log).
 */
export type TensorRole = 'embedding' | 'linear' | 'bias' | 'norm' | 'normOffset' | 'ones' | 'decayLog';

/** The block's projections by their HF module names (an engine fact: what LoRA can target). */
export { PROJECTIONS, type Projection } from '../../../native/model-binding';

export interface TensorSpec {
  /** Hugging Face name, e.g. `model.layers.3.self_attn.q_proj.weight`. */
  name: string;
  shape: number[];
  /** How it is initialised: normal(0, 0.02) for embeddings and linears, zeros for biases, ones for norms. */
  role: TensorRole;
  /** The engine's parameter it fills; `layer` is its block (-1 for model slots). */
  slot: ModelSlot | LayerSlot;
  layer: number;
  /** The expert of an `expert*` slot (0-based); absent otherwise. */
  expert?: number;
}

/** The architecture choices a family fixes or reads from config.json. */
export interface FamilyFeatures {
  /** q/k/v projections carry biases. */
  attentionBias: boolean;
  /** Per-head RMSNorm on q and k before RoPE. */
  qkNorm: boolean;
  /** Sparse MoE MLPs (Qwen3-MoE). */
  moe?: MoeConfig;
  /** The hybrid decoder's facts (Qwen3.5, `qwen3_5.ts`); see `ArchConfig` and `EngineConfig`. */
  layerTypes?: LayerType[];
  linearAttention?: LinearAttentionConfig;
  partialRotaryFactor?: number;
  normOffset?: boolean;
  attnOutputGate?: boolean;
  /** A family without a dense MLP (Qwen3.5-MoE) names the width `intermediate_size` falls back to. */
  intermediateSize?: number;
}

/** One architecture family: its config.json mapping and its tensor table (see README.md here). */
export interface Family {
  /** config.json `model_type`, and `ArchConfig.arch`. */
  modelType: string;
  /** config.json `architectures[0]` (the transformers class). */
  hfClass: string;
  /** transformers' default `max_position_embeddings` for this config class. */
  defaultMaxPositions: number;
  /** The features of a newly created model of this family (`model create`, test configs). */
  defaults: FamilyFeatures;
  /**
   * Reads the family's own fields after the common ones; rejects (naming the field) anything the
   * engine would silently ignore.
   */
  readFeatures(r: ConfigReader): FamilyFeatures;
  /** Rejects an ArchConfig this family cannot express; returns its own config.json fields. */
  hfFields(a: ArchConfig): Json;
  /**
   * A config.json whose text model's fields sit in a sub-object (the Hub's Qwen3.5 checkpoints,
   * `Qwen3_5ForConditionalGeneration`: `text_config`, beside a vision tower's): `read` gives the
   * object the common and family fields are read from, `write` nests a text model's flat fields.
   */
  nested?: {
    read(raw: Json, source: string): { raw: Json; source: string };
    write(text: Json): Json;
  };
  /** Every tensor in checkpoint order (embedding, layers in order, final norm, head). */
  tensors(a: ArchConfig): TensorSpec[];
}

/**
 * The dense decoder's tensors in HF Llama naming. `oProjBias`: `attention_bias` also puts a bias
 * on o_proj (Llama, Qwen3; Qwen2's hard-coded q/k/v biases do not).
 */
export function denseDecoderTensors(a: ArchConfig, opts: { oProjBias: boolean }): TensorSpec[] {
  return decoderTensors(a, opts, (_layer, add) => {
    add('mlp.gate_proj.weight', [a.intermediateSize, a.hiddenSize], 'linear', 'gate');
    add('mlp.up_proj.weight', [a.intermediateSize, a.hiddenSize], 'linear', 'up');
    add('mlp.down_proj.weight', [a.hiddenSize, a.intermediateSize], 'linear', 'down');
  });
}

/** Adds one tensor of block i: its name after `model.layers.<i>.`. */
export type AddLayerTensor = (
  suffix: string,
  shape: number[],
  role: TensorRole,
  slot: LayerSlot,
  expert?: number,
) => void;

/**
 * The decoder's tensors in HF Llama naming, with the MLP of block i given by `mlp` (after
 * `post_attention_layernorm`, as HF orders a block's modules).
 */
export function decoderTensors(
  a: ArchConfig,
  opts: { oProjBias: boolean },
  mlp: (i: number, add: AddLayerTensor) => void,
): TensorSpec[] {
  const q = a.numHeads * a.headDim;
  const kv = a.numKvHeads * a.headDim;
  const specs: TensorSpec[] = [
    {
      name: 'model.embed_tokens.weight',
      shape: [a.vocabSize, a.hiddenSize],
      role: 'embedding',
      slot: 'embed',
      layer: -1,
    },
  ];
  for (let i = 0; i < a.numLayers; i++) {
    const p = `model.layers.${i}`;
    const add: AddLayerTensor = (suffix, shape, role, slot, expert) =>
      specs.push({ name: `${p}.${suffix}`, shape, role, slot, layer: i, ...(expert === undefined ? {} : { expert }) });
    add('input_layernorm.weight', [a.hiddenSize], 'norm', 'inputNorm');
    add('self_attn.q_proj.weight', [q, a.hiddenSize], 'linear', 'q');
    add('self_attn.k_proj.weight', [kv, a.hiddenSize], 'linear', 'k');
    add('self_attn.v_proj.weight', [kv, a.hiddenSize], 'linear', 'v');
    if (a.attentionBias) {
      add('self_attn.q_proj.bias', [q], 'bias', 'qBias');
      add('self_attn.k_proj.bias', [kv], 'bias', 'kBias');
      add('self_attn.v_proj.bias', [kv], 'bias', 'vBias');
    }
    if (a.qkNorm) {
      add('self_attn.q_norm.weight', [a.headDim], 'norm', 'qNorm');
      add('self_attn.k_norm.weight', [a.headDim], 'norm', 'kNorm');
    }
    add('self_attn.o_proj.weight', [a.hiddenSize, q], 'linear', 'o');
    if (a.attentionBias && opts.oProjBias) add('self_attn.o_proj.bias', [a.hiddenSize], 'bias', 'oBias');
    add('post_attention_layernorm.weight', [a.hiddenSize], 'norm', 'postNorm');
    mlp(i, add);
  }
  specs.push({ name: 'model.norm.weight', shape: [a.hiddenSize], role: 'norm', slot: 'norm', layer: -1 });
  if (!a.tieWordEmbeddings)
    specs.push({
      name: 'lm_head.weight',
      shape: [a.vocabSize, a.hiddenSize],
      role: 'linear',
      slot: 'lmHead',
      layer: -1,
    });
  return specs;
}

/** Qwen2/Qwen3 configs may turn on sliding-window attention, which the engine does not implement. */
export function rejectSlidingWindow(r: ConfigReader): void {
  if (r.bool('use_sliding_window', false))
    r.fail('use_sliding_window', 'is true; sliding-window attention is not supported');
}

/** The config.json fields Qwen2/Qwen3 write for full attention. */
export function fullAttentionFields(a: ArchConfig): Json {
  return { use_sliding_window: false, sliding_window: null, max_window_layers: a.numLayers };
}

/** For families without q/k norms (toHfConfig). */
export function noQkNorm(a: ArchConfig): void {
  if (a.qkNorm) throw new Error(`qkNorm is true but ${a.arch} has no q/k norms`);
}

/**
 * How many of `numLayers` blocks are sparse, by `isSparseLayer`'s rule in closed form (a config.json
 * may claim 10^7 blocks: the count must not walk them). `mlpOnlyLayers` holds distinct indices.
 */
export function sparseLayerCount(moe: MoeConfig | undefined, numLayers: number): number {
  if (moe === undefined || moe.numExperts <= 0) return 0;
  const step = moe.decoderSparseStep;
  const kept = moe.mlpOnlyLayers.filter((l) => l < numLayers && (l + 1) % step === 0).length;
  return Math.floor(numLayers / step) - kept;
}

/** Whether block `layer` has a sparse MoE MLP (transformers' Qwen3MoeDecoderLayer rule). */
export function isSparseLayer(moe: MoeConfig | undefined, layer: number): boolean {
  return (
    moe !== undefined &&
    !moe.mlpOnlyLayers.includes(layer) &&
    moe.numExperts > 0 &&
    (layer + 1) % moe.decoderSparseStep === 0
  );
}
