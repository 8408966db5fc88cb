/** [lora]: low-rank adapters instead of full fine-tuning (SFT and the RL trainer). */
import { z } from 'zod';
import { PROJECTIONS } from '../../../native/model-binding';
import { positiveInt, section } from './common';

export const loraSchema = section({
  enabled: z.boolean().default(false).describe('train low-rank adapters instead of all weights'),
  rank: positiveInt().default(16).describe('adapter rank'),
  alpha: z.number().positive().default(32).describe('adapter scaling numerator (scale = alpha / rank)'),
  dropout: z.number().min(0).lt(1).default(0).describe('dropout on the adapter input'),
  target_modules: z
    .array(z.enum(PROJECTIONS))
    .min(1)
    .default([...PROJECTIONS])
    .describe('projections that get adapters'),
});
