/**
 * The architecture facts the native engine needs, normalised from a Hugging Face `config.json`
 * by the family modules (`families/`). This is the contract between `lib/model` (which reads and
 * writes HF folders) and `native/` (which computes with them).
 */
import type { Arch } from './families';

export type { Arch };

export interface ArchConfig {
  arch: Arch;
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  rmsNormEps: number;
  ropeTheta: number;
  maxPositionEmbeddings: number;
  tieWordEmbeddings: boolean;
  /** q/k/v projections carry biases (Qwen2; Llama's and Qwen3's `attention_bias`, which adds o_proj's). */
  attentionBias: boolean;
  /** per-head RMSNorm on q and k before RoPE (Qwen3). */
  qkNorm: boolean;
  /** Mixture-of-experts MLPs (Qwen3-MoE); absent for dense models. */
  moe?: MoeConfig;
}

/**
 * A Qwen3-MoE block's sparse MLP: a router picks `numExpertsPerTok` of `numExperts` SwiGLU experts
 * of width `moeIntermediateSize` per token. Which blocks are sparse: `isSparseLayer`
 * (families/decoder.ts); the others keep a dense MLP of width `intermediateSize`.
 */
export interface MoeConfig {
  numExperts: number;
  numExpertsPerTok: number;
  moeIntermediateSize: number;
  /** Every `decoderSparseStep`-th block is sparse (layer l when (l + 1) % step == 0)... */
  decoderSparseStep: number;
  /** ...unless it is listed here. */
  mlpOnlyLayers: number[];
  /** Renormalise the top-k routing probabilities to sum to 1. */
  normTopkProb: boolean;
}

/** safetensors dtypes the loader accepts on disk. */
export type DiskDType = 'F32' | 'F16' | 'BF16';

/** One tensor as handed to the native engine: raw little-endian bytes, copied once on the C++ side. */
export interface NamedTensor {
  name: string;
  dtype: DiskDType;
  shape: number[];
  data: Buffer;
}

/** Dtypes the engine reads and writes: the safetensors ones, plus F64 (used by gradient checks). */
export type TensorDType = DiskDType | 'F64';

/** A tensor as raw little-endian bytes. Every `NamedTensor` is one. */
export interface WeightTensor extends Omit<NamedTensor, 'dtype'> {
  dtype: TensorDType;
}
