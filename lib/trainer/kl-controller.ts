/**
 * The KL penalty's beta (trainer.kl_penalty). Fixed without target_kl; with it, the adaptive
 * controller of Ziegler et al. (2019, "Fine-Tuning Language Models from Human Preferences") with
 * one update per trainer step: beta *= 1 + clip(KL / target_kl - 1, -0.2, 0.2), KL the step's
 * measured mean k3 KL to the reference. So beta moves at most 20% a step, up while the policy
 * drifts past the target and down while it stays inside.
 *
 * beta is a pure function of its start value and the KLs measured so far: the runtime stores it
 * in each checkpoint and replays recompute it, so a restored trainer continues with the same beta.
 */
export interface KlPenalty {
  enabled: boolean;
  /** The weight, or its start value when targetKl is set. */
  beta: number;
  targetKl?: number;
}

/** The clip on KL / target - 1: the most beta changes in one step (fraction). */
export const KL_BETA_MAX_STEP = 0.2;

/** beta for the step after one that used `beta` and measured `kl`. */
export function nextKlBeta(p: KlPenalty, beta: number, kl: number): number {
  // A non-finite KL (a diverged step) carries no information on which way to go.
  if (!p.enabled || p.targetKl === undefined || !Number.isFinite(kl)) return beta;
  const error = Math.min(Math.max(kl / p.targetKl - 1, -KL_BETA_MAX_STEP), KL_BETA_MAX_STEP);
  return beta * (1 + error);
}
