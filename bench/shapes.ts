import type { CreateModelOptions } from '../lib/model/create';

/**
 * Qwen3-0.6B's shape with random weights (the GPU benchmarks' model, issue #16): hidden 1024,
 * intermediate 3072, 28 layers, 16 heads / 8 kv heads of width 128, the Qwen3 tokenizer's
 * 151,936-token vocabulary, tied embeddings, rope_theta 1e6. 596M parameters, stored in bf16.
 */
export const QWEN3_0_6B: Omit<CreateModelOptions, 'out' | 'seed'> = {
  arch: 'qwen3',
  preset: 'small',
  tokenizer: 'qwen3',
  hiddenSize: 1024,
  intermediateSize: 3072,
  numLayers: 28,
  numHeads: 16,
  numKvHeads: 8,
  headDim: 128,
  vocabSize: 151936,
  ropeTheta: 1e6,
  maxPositionEmbeddings: 40960,
  tieWordEmbeddings: true,
  dtype: 'bfloat16',
};

/**
 * Qwen3.5-0.8B's shape with random weights (issue #46's benchmarks), from its config.json's text
 * fields: hidden 1024, intermediate 3584, 24 blocks (every 4th gated full attention: 8 heads / 2 kv
 * heads of width 256, RoPE on a quarter of each head; the others Gated DeltaNet: 16 q/k and 16 v
 * heads of width 128, kernel 4), the 248,320-token vocabulary (the Qwen3 tokenizer's ids inside
 * it), tied embeddings, rope_theta 1e7. The text model alone (Qwen3_5ForCausalLM), stored in bf16.
 */
export const QWEN3_5_0_8B: Omit<CreateModelOptions, 'out' | 'seed'> = {
  arch: 'qwen3_5_text',
  preset: 'small',
  tokenizer: 'qwen3',
  hiddenSize: 1024,
  intermediateSize: 3584,
  numLayers: 24,
  numHeads: 8,
  numKvHeads: 2,
  headDim: 256,
  vocabSize: 248320,
  ropeTheta: 1e7,
  maxPositionEmbeddings: 262144,
  tieWordEmbeddings: true,
  linearAttention: { numKeyHeads: 16, numValueHeads: 16, keyHeadDim: 128, valueHeadDim: 128, convKernel: 4 },
  dtype: 'bfloat16',
};
