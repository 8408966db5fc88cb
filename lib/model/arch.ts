/**
 * The architecture facts the native engine needs, normalised from a Hugging Face `config.json`
 * by the family modules (`families/`). This is the contract between `lib/model` (which reads and
 * writes HF folders) and `native/` (which computes with them).
 */
import type { EngineConfig, LinearAttentionConfig, TensorDType, WeightTensor } from '../../native/model-binding';
import type { Arch } from '../config/names';

export type { Arch, LinearAttentionConfig, TensorDType, WeightTensor };

/** The token mixer of a hybrid model's block (config.json `layer_types`). */
export const LAYER_TYPES = ['linear_attention', 'full_attention'] as const;
export type LayerType = (typeof LAYER_TYPES)[number];

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
  /**
   * Hybrid models (Qwen3.5): each block's token mixer, Gated DeltaNet (`linear_attention`, sized by
   * `linearAttention`) or gated full attention; absent: every block is full attention.
   */
  layerTypes?: LayerType[];
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
  /**
   * Qwen3.5-MoE: a shared SwiGLU expert of this width beside the routed ones, scaled per token by
   * sigmoid(shared_expert_gate x); absent: none.
   */
  sharedExpertIntermediateSize?: number;
}

/** safetensors dtypes the loader accepts on disk. */
export type DiskDType = 'F32' | 'F16' | 'BF16';
