/** [distill]: online distillation from a teacher served over HTTP. */
import { z } from 'zod';
import { DISTILL_BASELINES } from '../../orchestrator/distill';
import { nonNegative, section } from './common';

export const distillSchema = section({
  teacher: z
    .strictObject({
      base_url: z
        .string()
        .url()
        .describe(
          "the OpenAI-compatible server serving the teacher (http://host:port/v1): `prime-rl inference`, or any server whose /completions returns the prompt tokens' logprobs with echo and logprobs (vLLM)",
        ),
      model: z
        .string()
        .min(1)
        .describe("the teacher's model folder: its tokenizer must be the student's (checked when the run starts)"),
      served_model: z
        .string()
        .min(1)
        .optional()
        .describe(
          "the teacher's name on its server, sent as the requests' `model`; unset = the one model GET base_url/models lists (an error naming this key when it lists several)",
        ),
      api_key_var: z
        .string()
        .min(1)
        .optional()
        .describe(
          "environment variable holding the teacher's API key, sent as a bearer token (set it for the cpu workers); unset = no key",
        ),
    })
    .optional()
    .describe(
      "online distillation from a teacher: each generated token's advantage is the teacher's logprob of it minus the student's (reverse KL), plus weight x the environment's advantage; unset = off",
    ),
  weight: nonNegative()
    .default(0)
    .describe(
      'distillation: weight of the environment-reward advantage added to the teacher term (0 = pure distillation)',
    ),
  baseline: z
    .enum(DISTILL_BASELINES)
    .default('none')
    .describe(
      "distillation: subtracted from each token's teacher term, keeping its expected gradient: none, or position (the mean term of the other rollouts of its group at the same generated position, leave-one-out)",
    ),
});
