/** trainer.loss and trainer.kl_penalty: the policy loss of the native registry and the KL penalty. */
import { z } from 'zod';
import { LOSS_NORMALIZATIONS, MISMATCH_DEFAULTS, MISMATCH_MODES } from '../../../native/engine-types.generated';
import { LOSS_PARAMS, lossKindSpec, POLICY_LOSSES, type LossParamName } from '../../../native/loss-kinds';
import { section } from './common';

/** One optional key per loss parameter of the native registry, with its range and the kinds that use it. */
const lossParamKeys = Object.fromEntries(
  [...LOSS_PARAMS.values()].map((p) => {
    const n = z.number().min(p.min);
    return [
      p.name,
      (p.max === undefined ? n : n.max(p.max))
        .optional()
        .describe(`${p.doc} (loss ${p.kinds.join(', ')}; default ${p.default})`),
    ];
  }),
) as Record<LossParamName, z.ZodOptional<z.ZodNumber>>;

/**
 * trainer.loss: the policy loss (names and parameters from the native registry, native/loss-kinds)
 * and the corrections every policy loss shares. The chosen type's parameters are filled from
 * their defaults; setting one of another type is an error.
 */
export const lossSchema = z
  .strictObject({
    type: z.enum(POLICY_LOSSES).default('dppo').describe('policy loss'),
    ...lossParamKeys,
    normalization: z
      .enum(LOSS_NORMALIZATIONS)
      .default('token')
      .describe('average the loss over all tokens or per sequence'),
    kl_beta: z.number().optional().describe('removed: the KL penalty to the initial model is trainer.kl_penalty'),
    mismatch: section({
      mode: z
        .enum(MISMATCH_MODES)
        .default('none')
        .describe(
          "correction of the trainer/inference mismatch, on each token's policy term (not kl_tau's): tis = times min(ratio, tis_cap), mask = drop the tokens and samples outside the bounds below",
        ),
      tis_cap: z.number().positive().default(MISMATCH_DEFAULTS.tisCap).describe('TIS: cap C on the importance weight'),
      token_low: z
        .number()
        .positive()
        .default(MISMATCH_DEFAULTS.tokenLow)
        .describe('mask: drop tokens with ratio below this'),
      token_high: z
        .number()
        .positive()
        .default(MISMATCH_DEFAULTS.tokenHigh)
        .describe('mask: drop tokens with ratio above this'),
      seq_low: z
        .number()
        .positive()
        .default(MISMATCH_DEFAULTS.seqLow)
        .describe('mask: drop sequences whose geometric-mean ratio is below this'),
      seq_high: z
        .number()
        .positive()
        .default(MISMATCH_DEFAULTS.seqHigh)
        .describe('mask: drop sequences whose geometric-mean ratio is above this'),
    }),
  })
  .prefault({})
  .superRefine((l, ctx) => {
    // 0 (off, the old default) passes: run folders written before keep resuming.
    if (l.kl_beta !== undefined && l.kl_beta !== 0)
      ctx.addIssue({
        code: 'custom',
        path: ['kl_beta'],
        message: 'removed: set trainer.kl_penalty (enabled, beta, target_kl) instead',
      });
    const own = lossKindSpec(l.type).params.map((p) => p.name);
    for (const key of LOSS_PARAMS.keys())
      if (l[key] !== undefined && !own.includes(key))
        ctx.addIssue({
          code: 'custom',
          path: [key],
          message: `not a parameter of loss type '${l.type}' (its parameters: ${own.join(', ') || 'none'})`,
        });
  })
  .transform(({ kl_beta: _removed, ...l }) => ({
    ...l,
    ...Object.fromEntries(lossKindSpec(l.type).params.map((p) => [p.name, l[p.name as LossParamName] ?? p.default])),
  }));

/**
 * trainer.kl_penalty: beta * k3 KL to the reference (initial) policy on every loss token. With
 * target_kl, beta adapts after each step by the adaptive controller of Ziegler et al. (2019) with
 * one update per step: beta *= 1 + clip(KL / target_kl - 1, -0.2, 0.2), KL the step's measured
 * mean k3 (lib/trainer/kl-controller.ts). The top-level [kl_penalty] table maps here.
 */
export const klPenaltySchema = section({
  enabled: z.boolean().default(false).describe('penalise the KL divergence to the reference (initial) policy'),
  beta: z.number().positive().default(0.001).describe('weight of the KL term (its start value when target_kl is set)'),
  target_kl: z
    .number()
    .positive()
    .optional()
    .describe('adapt beta each step toward this measured KL; unset = fixed beta'),
});
