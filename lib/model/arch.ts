/**
 * The architecture facts the native engine needs, normalised from a Hugging Face `config.json`
 * by the family modules (`families/`). This is the contract between `lib/model` (which reads and
 * writes HF folders) and `native/` (which computes with them).
 */
import type { EngineConfig, TensorDType, WeightTensor } from '../../native/model-binding';
import type { Arch } from './families';

export type { Arch, TensorDType, WeightTensor };

/** The engine's facts (vocabSize, hiddenSize, numLayers, heads, headDim, rmsNormEps, ropeTheta) and the rest. */
export interface ArchConfig extends EngineConfig {
  arch: Arch;
  intermediateSize: number;
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
