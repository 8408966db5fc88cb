/** The tiny Qwen3-MoE model the inference and SFT tests share (no side effects on import). */
import { createModel } from '../lib/model/create';

/** A tiny qwen3_moe model in `out` (bytes tokenizer, seed 0): sparse blocks 0 and 2 around a dense block 1. */
export function createTinyMoe(out: string): void {
  createModel({
    arch: 'qwen3_moe',
    preset: 'tiny',
    tokenizer: 'bytes',
    seed: 0,
    out,
    numLayers: 3,
    moe: { mlpOnlyLayers: [1] },
  });
}
