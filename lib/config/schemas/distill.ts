/**
 * [distill]: distillation during RL (docs/algorithms.md, "Distillation"), of three kinds:
 *   opd:  on-policy distillation; a teacher served over HTTP scores the tokens the student sampled;
 *   sft:  the teacher generates the rollouts and the student trains on them by cross-entropy;
 *   opsd: on-policy self-distillation; the policy itself, shown a demonstration, scores them.
 * The same table overrides the run's for one environment (`[[env]] distill`, or `false`: none).
 */
import { z } from 'zod';
import { DISTILL_BASELINES, DISTILL_TYPES } from '../names';
import { nonNegative } from './common';

/** opsd's leading system message; `{demonstration}` is the example's demonstration. */
export const OPSD_TEMPLATE =
  'Here is an example of an expert response:\n<demonstration>\n{demonstration}\n</demonstration>';

export const teacherSchema = z
  .strictObject({
    base_url: z
      .string()
      .url()
      .describe(
        "the OpenAI-compatible server serving the teacher (http://host:port/v1): `prime-rl inference`, or any server whose /completions returns the prompt tokens' logprobs with echo and logprobs (vLLM); type sft samples from it through /v1/generate (`prime-rl inference`)",
      ),
    model: z
      .string()
      .min(1)
      .describe(
        "the teacher's model folder or Hugging Face name: its tokenizer must be the student's (checked when the run starts)",
      ),
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
  .describe('a model served elsewhere, never updated by the run');

const distillObject = z
  .strictObject({
    type: z
      .enum(DISTILL_TYPES)
      .default('opd')
      .describe(
        "opd: the teacher scores the student's tokens (each token's advantage is the teacher's logprob minus the student's, reverse KL); sft: the teacher generates the rollouts and the student trains on them by cross-entropy; opsd: the policy itself scores them with the example's demonstration shown first (demo_key)",
      ),
    teacher: teacherSchema
      .optional()
      .describe(
        'the teacher (opd, sft); unset with type opd = no distillation. opsd has none: the policy teaches itself',
      ),
    weight: nonNegative()
      .default(0)
      .describe(
        'opd, opsd: weight of the environment-reward advantage added to the teacher term (0 = pure distillation)',
      ),
    baseline: z
      .enum(DISTILL_BASELINES)
      .default('none')
      .describe(
        "opd, opsd: subtracted from each token's teacher term, keeping its expected gradient: none, or position (the mean term of the other rollouts of its group at the same generated position, leave-one-out)",
      ),
    demo_key: z
      .string()
      .min(1)
      .optional()
      .describe(
        "opsd: the example field holding the demonstration (its info first, then the example itself, e.g. answer); unset = 'demonstration'",
      ),
    template: z
      .string()
      .min(1)
      .optional()
      .describe('opsd: the content of the system message shown before the rollout; {demonstration} is replaced'),
  })
  .superRefine((d, ctx) => {
    if (d.type === 'sft' && d.teacher === undefined)
      ctx.addIssue({
        code: 'custom',
        path: ['teacher'],
        message: 'type sft samples the rollouts from a teacher: set distill.teacher (base_url, model)',
      });
    if (d.type === 'opsd' && d.teacher !== undefined)
      ctx.addIssue({
        code: 'custom',
        path: ['teacher'],
        message: 'type opsd distills the policy into itself (shown a demonstration): it has no teacher; remove it',
      });
    for (const k of ['demo_key', 'template'] as const)
      if (d[k] !== undefined && d.type !== 'opsd')
        ctx.addIssue({
          code: 'custom',
          path: [k],
          message: `is a setting of type opsd (self-distillation), and type is ${d.type}`,
        });
    if (d.template !== undefined && !d.template.includes('{demonstration}'))
      ctx.addIssue({
        code: 'custom',
        path: ['template'],
        message: 'has no {demonstration}: the demonstration would never be shown',
      });
    if (d.type === 'sft' && (d.weight !== 0 || d.baseline !== 'none'))
      ctx.addIssue({
        code: 'custom',
        path: [d.weight !== 0 ? 'weight' : 'baseline'],
        message: "type sft trains by cross-entropy on the teacher's tokens: it has no advantage to weigh or baseline",
      });
  })
  .transform((d) =>
    d.type === 'opsd' ? { ...d, demo_key: d.demo_key ?? 'demonstration', template: d.template ?? OPSD_TEMPLATE } : d,
  );

export const distillSchema = distillObject.prefault({});
/** `[[env]] distill`: the run's [distill] for this environment, replaced; false = none here. */
export const envDistillSchema = z.union([z.literal(false), distillObject]);

export type DistillConfig = z.output<typeof distillObject>;

/** Whether a [distill] table distills at all: opsd always, opd and sft with a teacher. */
export const distills = (d: DistillConfig | false | undefined): d is DistillConfig =>
  d !== undefined && d !== false && (d.type === 'opsd' || d.teacher !== undefined);
