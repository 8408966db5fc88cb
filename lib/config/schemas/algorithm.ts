/**
 * The algorithm's parts a run and each of its environments choose (docs/algorithms.md): the
 * advantage estimator (`orchestrator.advantage`), echo's cross-entropy on observation tokens
 * (`orchestrator.echo`), distillation ([distill], distill.ts), and per environment admission gates.
 * A training environment (`[[env]]` of rl) may replace the run's advantage, distill and echo with
 * its own (prime-rl's per-source `algo`).
 */
import { z } from 'zod';
import { ADVANTAGE_KINDS, ECHO_ROLES } from '../names';
import { nonNegative } from './common';
import { envDistillSchema } from './distill';
import { envSchema } from './envs';

/** `orchestrator.advantage`: a built-in estimator (type + options) or a plugin (import_path + kwargs). */
const advantageObject = z
  .strictObject({
    type: z
      .enum(ADVANTAGE_KINDS)
      .optional()
      .describe(
        "built-in estimator: grpo (R - mean), rloo (leave-one-out), opo (length-weighted baseline), max_rl ((R - mean) / mean), rae (R minus an EMA of the rewards of the rollout's agent, per environment); unset = grpo unless import_path is set",
      ),
    std_norm: z
      .boolean()
      .default(false)
      .describe('group built-ins: divide advantages by the group reward std (not with max_rl or rae)'),
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
        'group built-ins: subtract mean(R) x the weighted length terms from each reward before the estimator; unset = off',
      ),
    decay: z
      .number()
      .min(0)
      .lt(1)
      .optional()
      .describe(
        "rae: the baselines' EMA decay; after each rollout its agent's baseline becomes decay x baseline + (1 - decay) x reward; unset = 0.95",
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
    const issue = (path: string, message: string) => ctx.addIssue({ code: 'custom', path: [path], message });
    if (a.import_path !== undefined) {
      for (const k of ['type', 'length_penalty', 'decay'] as const)
        if (a[k] !== undefined)
          issue(
            k,
            `set either ${k} (a built-in) or import_path (a plugin estimator, which computes the advantages itself), not both`,
          );
      if (a.std_norm)
        issue('std_norm', 'std_norm applies to built-in estimators only; a plugin (import_path) normalises itself');
    } else if (Object.keys(a.kwargs).length > 0) {
      issue(
        'kwargs',
        'kwargs are passed to a plugin estimator: set import_path, or configure a built-in with type, std_norm and length_penalty',
      );
    }
    if (a.type === 'max_rl' && a.std_norm)
      issue('std_norm', 'max_rl normalises by the group mean: std_norm must stay false');
    if (a.type === 'rae') {
      if (a.std_norm) issue('std_norm', 'rae has no group to normalise by: std_norm must stay false');
      if (a.length_penalty !== undefined)
        issue('length_penalty', "rae's baseline is an EMA of rewards: the length penalty is a group built-in's");
    } else if (a.decay !== undefined) issue('decay', `is rae's EMA decay, and type is ${a.type ?? 'grpo'}`);
  })
  // The built-in default, filled here so that --dry-run shows what runs.
  .transform((a) =>
    a.import_path !== undefined
      ? a
      : { ...a, type: a.type ?? 'grpo', ...(a.type === 'rae' ? { decay: a.decay ?? 0.95 } : {}) },
  );

export const advantageSchema = advantageObject.prefault({});

/** `orchestrator.echo`: cross-entropy on the environment's observation tokens of chosen roles. */
const echoObject = z
  .strictObject({
    roles: z
      .partialRecord(z.enum(ECHO_ROLES), z.number().positive())
      .default({ tool: 0.1 })
      .describe(
        "role -> weight: the tokens of the environment's messages of that role after the first sampled turn (tool results, user feedback) are trained by cross-entropy times the weight, beside the policy loss; default tool = 0.1",
      ),
  })
  .superRefine((e, ctx) => {
    if (Object.keys(e.roles).length === 0)
      ctx.addIssue({
        code: 'custom',
        path: ['roles'],
        message: 'echo needs at least one role (system, user, assistant, tool)',
      });
  });
export const echoSchema = echoObject
  .optional()
  .describe(
    "ECHO: the environment's observation tokens of the chosen roles trained by weighted cross-entropy beside the policy loss (docs/algorithms.md); unset = off",
  );

/** An admission gate of one environment's groups. */
const gateSchema = z.discriminatedUnion('type', [
  z.strictObject({
    type: z.literal('advantage_range'),
    reject_min: z.number().default(0).describe('drop a group whose every advantage is at least this...'),
    reject_max: z.number().default(0).describe('...and at most this (the default [0, 0]: no learning signal)'),
  }),
]);

/** `[[env]]` of rl: an environment of the training mix, with what it replaces of the run's algorithm. */
export const trainEnvSchema = envSchema
  .extend({
    advantage: advantageObject.optional().describe("this environment's advantage estimator; unset = the run's"),
    distill: envDistillSchema.optional().describe("this environment's [distill] (false: none); unset = the run's"),
    echo: z
      .union([z.literal(false), echoObject])
      .optional()
      .describe("this environment's echo (false: none); unset = the run's"),
    gates: z
      .record(z.string(), gateSchema)
      .optional()
      .describe(
        "admission gates by name: a group is trained on only if every gate admits it; one dropped is replaced as a rollout filter's (advantage_range: drop a group whose advantages all lie in [reject_min, reject_max])",
      ),
  })
  .superRefine((e, ctx) => {
    for (const [name, g] of Object.entries(e.gates ?? {}))
      if (g.reject_min > g.reject_max)
        ctx.addIssue({
          code: 'custom',
          path: ['gates', name, 'reject_min'],
          message: `${g.reject_min} is above reject_max (${g.reject_max})`,
        });
  })
  .describe('training environment');

export type AdvantageSettings = z.output<typeof advantageObject>;
export type EchoConfig = z.output<typeof echoObject>;
export type GateConfig = z.output<typeof gateSchema>;
export type TrainEnvConfig = z.output<typeof trainEnvSchema>;
