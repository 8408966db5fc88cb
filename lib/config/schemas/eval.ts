/**
 * Evals: the [eval] section of rl and sft (interval, size, k, sampling, environments) and the
 * `eval` command, which evaluates model versions or an external API on its own.
 */
import { z } from 'zod';
import { checkMaxTokens, outputDir, positiveInt, runName, section, seed, seqLen, threads } from './common';
import { concurrencySchema } from './concurrency';
import { envSchema } from './envs';
import { serverSchema } from './inference';
import { computeDtypeSchema, deviceSchema } from './model';
import { temporalSchema, withRunQueue } from './temporal';
import { samplingSchema } from './sampling';

/** Held-out examples per environment: a count, or -1 for all of them (prime-rl's spelling). */
export const evalExamples = () =>
  z
    .number()
    .int()
    .refine((n) => n >= 1 || n === -1, 'a positive count, or -1 for all')
    .describe('held-out examples per environment; -1 = all of them');

/** An eval environment: an environment, optionally with its own size and k. */
export const evalEnvSchema = envSchema
  .extend({
    num_examples: evalExamples().optional().describe("this environment's held-out examples; unset = the eval's"),
    rollouts_per_example: positiveInt()
      .optional()
      .describe("this environment's k of avg@k / pass@k; unset = the eval's"),
  })
  .describe('eval environment');

/** The concurrency of an eval's rollouts (lib/orchestrator/concurrency.ts). */
const evalConcurrency = () =>
  concurrencySchema.describe(
    "rollouts in flight at once: adapted to the inference server's KV cache and preemptions between min_inflight and max_inflight; against an external API (no load signal) initial_inflight, else min(64, max_inflight), at once",
  );

export const evalShape = {
  interval: positiveInt().optional().describe('run an eval every N steps (and at the end); unset = off'),
  num_examples: evalExamples().default(32),
  rollouts_per_example: positiveInt().default(1).describe('k of avg@k / pass@k'),
  sampling: samplingSchema,
  concurrency: evalConcurrency(),
};
export const evalSettings = section({
  ...evalShape,
  env: z.array(evalEnvSchema).default([]).describe('eval environments; empty = the training environments'),
});

export const evalSchema = z
  .strictObject({
    run_name: runName('eval'),
    model: section({
      name: z.string().min(1).optional().describe('model folder, or the model name an external API expects'),
      dtype: computeDtypeSchema(),
      device: deviceSchema(),
    }),
    seq_len: seqLen(),
    output_dir: outputDir(),
    seed: seed(),
    env: z.array(evalEnvSchema).default([]).describe('environments to evaluate'),
    num_examples: evalExamples().default(32),
    rollouts_per_example: positiveInt().default(1).describe('k of avg@k / pass@k'),
    sampling: samplingSchema,
    concurrency: evalConcurrency(),
    weights_dir: z.string().optional().describe('evaluate every step_N folder in this directory'),
    steps: z.array(z.number().int().nonnegative()).optional().describe('only these steps of weights_dir'),
    eval_base: z.boolean().default(true).describe('also evaluate the base model'),
    client: section({
      base_url: z.string().url().optional().describe('external OpenAI-compatible API instead of a local server'),
      api_key_var: z.string().optional().describe('environment variable holding its API key'),
    }),
    server: serverSchema.describe('the local inference server the eval starts (unless client.base_url)'),
    threads: threads(),
    temporal: temporalSchema,
  })
  .superRefine((c, ctx) => {
    // An external API (client.base_url) has its own context length; seq_len is that of the local server.
    if (c.client.base_url === undefined)
      checkMaxTokens(ctx, ['sampling', 'max_tokens'], c.sampling.max_tokens, c.seq_len, 'seq_len');
  })
  .transform(withRunQueue);

export type EvalConfig = z.output<typeof evalSchema>;
