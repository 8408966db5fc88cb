/**
 * What the engine needs to know of a model (the engine knows no Hugging Face names): tensors as
 * bytes, the architecture facts it reads, the tensor table that says which tensor fills which
 * parameter, and the projection names LoRA targets. lib/model binds an HF folder to these
 * (lib/model/engine.ts). Plain types and data: importing it does not load the addon.
 */

/** Dtypes the engine reads and writes tensors in: the safetensors ones it loads, plus F64 (gradient checks). */
export type TensorDType = 'F32' | 'F16' | 'BF16' | 'F64';

/** A tensor as raw little-endian bytes (copied once on the C++ side). */
export interface WeightTensor {
  name: string;
  dtype: TensorDType;
  shape: number[];
  data: Buffer;
}

/**
 * The architecture facts the engine reads (native/src/addon/convert.cc `archConfig`); the rest of
 * a model's shape it takes from the tensor table. lib/model's `ArchConfig` is one.
 */
export interface EngineConfig {
  arch: string;
  vocabSize: number;
  hiddenSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  rmsNormEps: number;
  ropeTheta: number;
  /** Mixture-of-experts blocks: how many experts a token goes to, and whether their weights are renormalised. */
  moe?: { numExpertsPerTok: number; normTopkProb: boolean };
  /** RMSNorm weights are stored as offsets from 1: out = x / rms(x) * (1 + w) (Qwen3.5). */
  normOffset?: boolean;
  /** The share of each head RoPE rotates: its first headDim * f dims (Qwen3.5: 0.25); default 1. */
  partialRotaryFactor?: number;
  /** q_proj yields each head's query and an output gate ([H, 2 hd] rows); sigmoid(gate) scales attention's output (Qwen3.5). */
  attnOutputGate?: boolean;
  /** The sizes of the Gated DeltaNet blocks (those whose table has the `linQkv` slot). */
  linearAttention?: LinearAttentionConfig;
}

/**
 * A Gated DeltaNet block's sizes (Qwen3.5 `linear_*` fields): q and k heads of keyHeadDim, v heads
 * of valueHeadDim (numValueHeads a multiple of numKeyHeads: each q/k head serves that many
 * consecutive v heads), and the causal depthwise convolution's kernel over q, k and v.
 */
export interface LinearAttentionConfig {
  numKeyHeads: number;
  numValueHeads: number;
  keyHeadDim: number;
  valueHeadDim: number;
  convKernel: number;
}

/** One row of a family's tensor table as the engine reads it (native/src/model.h `ParamSpec`). */
export interface EngineTensorSpec {
  /** The tensor's name in the weights handed to the engine. */
  name: string;
  shape: number[];
  /** Which parameter it fills: a block slot (`layerSlots()`) or a model-level one. */
  slot: string;
  /** Its decoder layer (-1 outside the blocks). */
  layer: number;
  /** Its expert in a sparse block. */
  expert?: number;
}

/**
 * A model family as the engine sees it (the engine knows no HF names): the architecture, which
 * tensor fills which parameter, and which names a checkpoint may carry that the model does not use
 * (dropped before loading). lib/model/engine.ts binds a Hugging Face config this way.
 */
export interface ModelBinding {
  config: EngineConfig;
  specs: readonly EngineTensorSpec[];
  ignorable(name: string): boolean;
}

/**
 * The block's projections by their HF module names, in the engine's order (native/src/model.cc
 * `projName`): what LoRA can target (`lora.target_modules`).
 */
export const PROJECTIONS = [
  'q_proj',
  'k_proj',
  'v_proj',
  'o_proj',
  'gate_proj',
  'up_proj',
  'down_proj',
  // Gated DeltaNet's (Qwen3.5).
  'in_proj_qkv',
  'in_proj_z',
  'in_proj_b',
  'in_proj_a',
  'out_proj',
] as const;
export type Projection = (typeof PROJECTIONS)[number];
