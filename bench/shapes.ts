import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createModel, type CreateModelOptions } from '../lib/model/create';
import { readHfConfig } from '../lib/model/hf';
import { parameterCount } from '../lib/model/tensors';
import type { ArchConfig } from '../lib/model/arch';

export type BenchShape = Omit<CreateModelOptions, 'out' | 'seed'>;

/**
 * Qwen3-0.6B's shape with random weights (the GPU benchmarks' model, issue #16): hidden 1024,
 * intermediate 3072, 28 layers, 16 heads / 8 kv heads of width 128, the Qwen3 tokenizer's
 * 151,936-token vocabulary, tied embeddings, rope_theta 1e6. 596M parameters, stored in bf16.
 */
export const QWEN3_0_6B: BenchShape = {
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
export const QWEN3_5_0_8B: BenchShape = {
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

/**
 * Qwen3-1.7B's shape (issue #52's second training target): hidden 2048, intermediate 6144, 28
 * layers, 16 heads / 8 kv heads of width 128, tied embeddings; 1.72B parameters, stored in bf16.
 */
export const QWEN3_1_7B: BenchShape = { ...QWEN3_0_6B, hiddenSize: 2048, intermediateSize: 6144 };

/** The tiny preset with the byte tokenizer: what a benchmark runs on the CPU to check itself. */
export const TINY: BenchShape = { arch: 'qwen3', preset: 'tiny', tokenizer: 'bytes' };

/** A tiny Qwen3.5 (4 blocks: 3 Gated DeltaNet, 1 full attention; byte tokenizer), for the same checks. */
export const TINY_QWEN3_5: BenchShape = { arch: 'qwen3_5_text', preset: 'tiny', tokenizer: 'bytes', numLayers: 4 };

/**
 * The small preset as a hybrid (8 blocks of width 512, 6 Gated DeltaNet and 2 full attention; byte
 * tokenizer, 24.3M parameters): the RL generation benchmark's Qwen3.5 on a CPU, beside `small` Qwen3.
 */
export const SMALL_QWEN3_5: BenchShape = { arch: 'qwen3_5_text', preset: 'small', tokenizer: 'bytes' };

const ROOT = path.resolve(__dirname, '..', '..');

/**
 * A benchmark model's folder, build/bench-models/<name>-<hash of its shape>: made once (random
 * weights, seed 1; `createModel` writes it atomically) and reused by later runs and benchmarks, so
 * a GPU session writes a 0.6B or 1.7B model once.
 */
export function benchModel(name: string, shape: BenchShape): { dir: string; config: ArchConfig; parameters: number } {
  const key = createHash('sha256').update(JSON.stringify(shape)).digest('hex').slice(0, 8);
  const dir = path.join(ROOT, 'build', 'bench-models', `${name}-${key}`);
  const config = fs.existsSync(path.join(dir, 'config.json'))
    ? readHfConfig(dir).config
    : createModel({ ...shape, seed: 1, out: dir }).config;
  return { dir, config, parameters: parameterCount(config) };
}
