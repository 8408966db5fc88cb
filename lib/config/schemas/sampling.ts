/** [sampling]: how rollouts and evals sample from the inference server. */
import { z } from 'zod';
import { nonNegative, positiveInt, section } from './common';

export const samplingSchema = section({
  temperature: nonNegative().default(1.0).describe('sampling temperature (0 = greedy)'),
  top_p: z.number().gt(0).max(1).default(1.0).describe('nucleus sampling mass'),
  top_k: z.number().int().min(-1).default(-1).describe('keep the k most likely tokens; -1 = off'),
  min_p: z.number().min(0).max(1).default(0).describe('drop tokens below min_p x the top probability'),
  max_tokens: positiveInt().optional().describe('max new tokens per turn; unset = up to seq_len'),
  stop: z
    .array(z.string().min(1))
    .max(16)
    .default([])
    .describe(
      'stop strings: a turn ends at the token that completes one (matched in the decoded text, special tokens left out)',
    ),
});
