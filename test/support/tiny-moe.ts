/** The tiny Qwen3-MoE model the inference and SFT tests share (no side effects on import). */
import type { ArchConfig } from '../../lib/model/arch';
import { FAMILIES } from '../../lib/model/families';
import { tinyConfig } from '../../lib/model/testing';
import { tinyModel } from './setup';

/** A tiny qwen3_moe config for engine tests: sparse blocks 0 and 2 around a dense block 1; 2 of 4 experts per token. */
export const tinyMoeConfig: ArchConfig = tinyConfig('qwen3_moe', {
  numLayers: 3,
  moe: {
    ...FAMILIES.qwen3_moe.defaults.moe!,
    numExperts: 4,
    numExpertsPerTok: 2,
    moeIntermediateSize: 32,
    mlpOnlyLayers: [1],
  },
});

/** A tiny qwen3_moe model in `out` (bytes tokenizer, seed 0): sparse blocks 0 and 2 around a dense block 1. */
export function createTinyMoe(out: string): void {
  tinyModel(out, { arch: 'qwen3_moe', numLayers: 3, moe: { mlpOnlyLayers: [1] } });
}
