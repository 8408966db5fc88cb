/** [orchestrator]: rollouts, their filters, advantages and in-flight mode. */
import { z } from 'zod';
import { ADVANTAGE_TYPES } from '../../orchestrator/advantages';
import { asyncLevel, maxSteps, nonNegative, outputDir, positiveInt, section, seed, seqLen } from './common';
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

/** `orchestrator.advantage`: a built-in estimator (type + options) or a plugin (import_path + kwargs). */
const advantageSchema = z
  .strictObject({
    type: z
      .enum(ADVANTAGE_TYPES)
      .optional()
      .describe(
        'built-in estimator: grpo (R - mean), rloo (leave-one-out), opo (length-weighted baseline), max_rl ((R - mean) / mean); unset = grpo unless import_path is set',
      ),
    std_norm: z
      .boolean()
      .default(false)
      .describe('built-ins: divide advantages by the group reward std (not with max_rl)'),
    length_penalty: z
      .strictObject({
        type: z.literal('linear').default('linear').describe('the penalty: linear'),
        num_output_tokens_weight: nonNegative().default(0.25).describe('weight of generated tokens / the group max'),
        num_input_tokens_weight: nonNegative()
          .default(0.1)
          .describe('weight of read tokens (prompt, env turns) / the group max'),
        num_turns_weight: nonNegative().default(0.1).describe('weight of turns / the group max'),
      })
      .optional()
      .describe(
        'built-ins: subtract mean(R) x the weighted length terms from each reward before the estimator; unset = off',
      ),
    import_path: z
      .string()
      .min(1)
      .optional()
      .describe(
        'plugin estimator module (./my_adv.ts relative to the working directory, an absolute path or an npm package); its `advantage` or default export: (group, kwargs) => advantages',
      ),
    kwargs: z.record(z.string(), z.unknown()).default({}).describe('keyword arguments passed to the plugin estimator'),
  })
  .superRefine((a, ctx) => {
    if (a.import_path !== undefined) {
      for (const k of ['type', 'length_penalty'] as const) {
        if (a[k] !== undefined)
          ctx.addIssue({
            code: 'custom',
            path: [k],
            message: `set either ${k} (a built-in) or import_path (a plugin estimator, which computes the advantages itself), not both`,
          });
      }
      if (a.std_norm)
        ctx.addIssue({
          code: 'custom',
          path: ['std_norm'],
          message: 'std_norm applies to built-in estimators only; a plugin (import_path) normalises itself',
        });
    } else if (Object.keys(a.kwargs).length > 0) {
      ctx.addIssue({
        code: 'custom',
        path: ['kwargs'],
        message:
          'kwargs are passed to a plugin estimator: set import_path, or configure a built-in with type, std_norm and length_penalty',
      });
    }
    if (a.type === 'max_rl' && a.std_norm) {
      ctx.addIssue({
        code: 'custom',
        path: ['std_norm'],
        message: 'max_rl normalises by the group mean: std_norm must stay false',
      });
    }
  })
  .prefault({})
  // The built-in default, filled here so that --dry-run shows what runs.
  .transform((a) => (a.import_path === undefined ? { ...a, type: a.type ?? 'grpo' } : a));

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
        'in-flight mode: cap on rollouts generated ahead of the steps (in flight, finished and not yet taken by a step, or left over by keep_mix); below it, concurrency adapts to keep up with the steps within what the servers take (docs/workflow.md, In-flight mode). Unset = 2 x batch_size',
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
