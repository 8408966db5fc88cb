/** [optim] and [scheduler]: AdamW and its learning-rate schedule (SFT and the RL trainer). */
import { z } from 'zod';
import { ADAMW_DEFAULTS } from '../../../native/engine-types.generated';
import { nonNegative, section } from './common';

export const optimizerSchema = section({
  lr: nonNegative()
    .optional()
    .describe('AdamW learning rate (0: the weights stay as they are); unset = 1e-6, or 1e-5 with lora.enabled'),
  weight_decay: nonNegative().default(ADAMW_DEFAULTS.weightDecay).describe('AdamW decoupled weight decay'),
  betas: z
    .tuple([z.number().min(0).max(1), z.number().min(0).max(1)])
    .default([ADAMW_DEFAULTS.beta1, ADAMW_DEFAULTS.beta2])
    .describe('AdamW betas'),
  eps: z.number().positive().default(ADAMW_DEFAULTS.eps).describe('AdamW epsilon'),
  max_norm: z.number().positive().default(1.0).describe('gradient-norm clipping threshold'),
});

export const schedulerSchema = section({
  type: z.enum(['constant', 'linear', 'cosine']).default('constant').describe('learning-rate schedule after warmup'),
  warmup_steps: z.number().int().nonnegative().default(0).describe('linear warmup steps from 0 to lr'),
  min_lr: nonNegative().default(0).describe('final learning rate of the linear and cosine schedules'),
});

/** The lr default depends on LoRA (as prime-rl: 1e-6 full, 1e-5 LoRA), so it is filled after parsing. */
export function withLrDefault<T extends { optim: { lr?: number }; lora: { enabled: boolean } }>(c: T) {
  return { ...c, optim: { ...c.optim, lr: c.optim.lr ?? (c.lora.enabled ? 1e-5 : 1e-6) } };
}
