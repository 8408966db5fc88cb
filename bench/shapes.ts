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
