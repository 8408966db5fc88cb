/** [orchestrator]: rollouts, their filters, advantages and in-flight mode. */
import { z } from 'zod';
import { advantageSchema, echoSchema } from './algorithm';
import { asyncLevel, maxSteps, nonNegative, outputDir, positiveInt, section, seed, seqLen } from './common';
import { concurrencySchema } from './concurrency';
import { rendererSchema } from './envs';
import { modelSchema } from './model';
import { samplingSchema } from './sampling';

/** A plugin module (lib/orchestrator/plugins.ts): `import_path` + `kwargs`. */
const pluginSchema = (what: string, contract: string) =>
  z.strictObject({
    import_path: z
      .string()
      .min(1)
      .describe(
        `${what} module: ./file.ts (relative to the working directory), an absolute path or an npm package; ${contract}`,
      ),
    kwargs: z.record(z.string(), z.unknown()).default({}).describe(`keyword arguments passed to the ${what}`),
  });

export const orchestratorSchema = section({
  model: modelSchema(),
  seq_len: seqLen(),
  max_steps: maxSteps(),
  async_level: asyncLevel(),
  output_dir: outputDir(),
  seed: seed(),
  batch_size: positiveInt().default(128).describe('rollouts per step'),
  rollouts_per_example: positiveInt()
    .default(8)
    .describe('rollouts per prompt (the group size of the advantage baseline)'),
  sampling: samplingSchema,
  advantage: advantageSchema,
  echo: echoSchema,
  concurrency: concurrencySchema.describe(
    "rollouts in flight at once: adapted to the inference servers' KV cache and preemptions between min_inflight and max_inflight (lib/orchestrator/concurrency.ts)",
  ),
  difficulty_filter: section({
    enabled: z
      .boolean()
      .default(false)
      .describe('drop groups outside the filter and refill the step with fresh examples'),
    min_reward_variance: nonNegative()
      .default(0)
      .describe(
        'drop groups whose reward variance (population) is below this; groups of equal rewards are always dropped when enabled',
      ),
    min_reward: z.number().optional().describe('drop groups whose mean reward is below this'),
    max_reward: z.number().optional().describe('drop groups whose mean reward is above this'),
  }),
  rollout_filters: z
    .array(
      pluginSchema(
        'rollout filter',
        '`filter` or default export: (group, kwargs) => true to keep, false or a reason to drop',
      ),
    )
    .default([])
    .describe('plugin filters, applied after difficulty_filter; dropped groups are refilled the same way'),
  max_refill_rounds: z
    .number()
    .int()
    .nonnegative()
    .default(4)
    .describe(
      'rounds of fresh examples a step may play to replace the groups its filters dropped; then it trains on what it has',
    ),
  in_flight: section({
    enabled: z
      .boolean()
      .default(false)
      .describe(
        'in-flight mode: rollouts are generated continuously and the inference servers take each new policy as soon as the trainer writes it ' +
          '(between two decode steps); a step trains the next batch_size finished rollouts. Off (strict mode): rollouts of step n use ' +
          'policy n - async_level exactly, so a run is reproducible',
      ),
    max_off_policy_steps: z
      .number()
      .int()
      .nonnegative()
      .default(8)
      .describe(
        'in-flight mode: a group whose oldest token is more than this many policy versions behind the step that would train it is dropped (and counted)',
      ),
    max_rollouts: positiveInt()
      .optional()
      .describe(
        'in-flight mode: cap on rollouts generated ahead of the steps (in flight, finished and not yet taken by a step, or left over by keep_mix); below it, the rollouts in flight follow orchestrator.concurrency (docs/workflow.md, Concurrency). Unset = 2 x batch_size',
      ),
    keep_mix: z
      .boolean()
      .default(false)
      .describe(
        "in-flight mode: each [[env]] entry gets strict mode's share of every step; a group beyond its env's share is left for the next step " +
          '(at most one step of groups left over; past that it is taken). Off: a step takes the groups in the order they finish, which favours envs with short rollouts',
      ),
  }),
  filter_zero_advantages: z
    .boolean()
    .default(true)
    .describe('do not train on rollouts whose advantage is exactly 0 (no policy-gradient signal)'),
  // The old filter section, kept so that its keys (in a file or on the command line) get this
  // error instead of "unknown key".
  filter: z
    .strictObject({
      zero_variance: z.unknown().optional().describe('removed: see orchestrator.difficulty_filter'),
      min_reward: z.unknown().optional().describe('removed: see orchestrator.difficulty_filter.min_reward'),
      max_reward: z.unknown().optional().describe('removed: see orchestrator.difficulty_filter.max_reward'),
    })
    .optional()
    .refine((v) => v === undefined, {
      message:
        'replaced by orchestrator.difficulty_filter { enabled, min_reward_variance, min_reward, max_reward }, which refills the groups it drops ' +
        '(zero_variance = true is enabled = true; zero_variance = false is the default, enabled = false) and orchestrator.filter_zero_advantages',
    })
    .describe('removed: see orchestrator.difficulty_filter'),
  renderer: rendererSchema(),
  env_workers: positiveInt().default(2).describe('child processes that run environment code'),
  env_timeout_s: z.number().positive().default(60).describe('seconds before an environment call counts as hung'),
  base_urls: z
    .array(z.string().url())
    .min(1)
    .optional()
    .describe(
      "inference servers to spread rollouts over (http://host:port/v1 each); unset = the run's own server, " +
        'http://<inference.server.host>:<inference.server.port>/v1, so changing that port moves both. Set it for ' +
        'servers started elsewhere (`worker --pool inference`); then it wins, and inference.server.api_key_var, ' +
        'max_running and max_queued still say how the orchestrator talks to them',
    ),
});

export type OrchestratorConfig = z.output<typeof orchestratorSchema>;
