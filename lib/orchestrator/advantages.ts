/**
 * Group advantages and online difficulty filtering (DESIGN.md §4, after prime-rl's
 * orchestrator/advantage.py). Each example is rolled out G times; a rollout's advantage is its
 * reward minus a baseline computed from its group, broadcast later to all its completion tokens.
 *
 * Baselines (`type`):
 *   grpo: b = mean(R)                                   A_i = R_i - mean(R)
 *   rloo: b_i = mean_{j != i} R_j                        A_i = R_i - b_i = G/(G-1) * (R_i - mean(R))
 *   opo:  b = sum_i |o_i| R_i / sum_i |o_i| (length-weighted; plain mean if every |o_i| is 0)
 * `std_norm` then divides by std(R) + 1e-8 with Bessel's correction (n - 1): prime-rl calls
 * `rewards.std()`, and torch's default is the unbiased estimate.
 */

export type AdvantageType = 'grpo' | 'rloo' | 'opo';

/** Same shape as the orchestrator config's `advantage` section. */
export interface AdvantageConfig {
  type: AdvantageType;
  std_norm: boolean;
}

/** Same shape as the orchestrator config's `filter` section. */
export interface FilterConfig {
  /** Drop groups whose valid rewards are all equal: every advantage would be 0. */
  zero_variance: boolean;
  min_reward?: number;
  max_reward?: number;
}

export interface RolloutOutcome {
  reward: number;
  /** Tokens the model generated (all assistant turns); OPO's |o_i|. */
  completionTokens: number;
  /** The rollout failed (env error, timeout, crash, inference error): excluded before grouping. */
  errored?: boolean;
}

export type GroupVerdict = 'kept' | 'too_few_valid' | 'zero_variance' | 'below_min_reward' | 'above_max_reward';

export interface AdvantageMetrics {
  groups: number;
  groups_kept: number;
  rollouts: number;
  rollouts_errored: number;
  /** Rollouts with an advantage: the valid rollouts of kept groups. */
  rollouts_kept: number;
  /** Groups dropped, by reason (each group counts under its first failing check, in this order). */
  filtered: Record<Exclude<GroupVerdict, 'kept'>, number>;
}

export interface AdvantageResult {
  /** Same shape as the input: the advantage of each rollout, or null when it is not trained on. */
  advantages: (number | null)[][];
  verdicts: GroupVerdict[];
  metrics: AdvantageMetrics;
}

const STD_EPS = 1e-8;

function mean(xs: readonly number[]): number {
  let s = 0;
  for (const x of xs) s += x;
  return s / xs.length;
}

/** Sample standard deviation (n - 1), as torch's `Tensor.std()`. */
export function sampleStd(xs: readonly number[]): number {
  const m = mean(xs);
  let ss = 0;
  for (const x of xs) ss += (x - m) * (x - m);
  return Math.sqrt(ss / (xs.length - 1));
}

/** Advantages of one group of valid rollouts (at least 2). */
export function groupAdvantages(rewards: readonly number[], lengths: readonly number[], cfg: AdvantageConfig): number[] {
  const g = rewards.length;
  if (g < 2) throw new Error(`advantages need at least 2 rollouts per group, got ${g}`);
  if (lengths.length !== g) throw new Error(`advantages: ${g} rewards but ${lengths.length} lengths`);
  let adv: number[];
  switch (cfg.type) {
    case 'grpo': {
      const b = mean(rewards);
      adv = rewards.map((r) => r - b);
      break;
    }
    case 'rloo': {
      const sum = rewards.reduce((s, r) => s + r, 0);
      adv = rewards.map((r) => r - (sum - r) / (g - 1));
      break;
    }
    case 'opo': {
      const totalLen = lengths.reduce((s, l) => s + l, 0);
      const b = totalLen > 0 ? rewards.reduce((s, r, i) => s + r * lengths[i], 0) / totalLen : mean(rewards);
      adv = rewards.map((r) => r - b);
      break;
    }
  }
  if (cfg.std_norm) {
    const std = sampleStd(rewards);
    adv = adv.map((a) => a / (std + STD_EPS));
  }
  return adv;
}

function verdict(rewards: readonly number[], filter: FilterConfig): GroupVerdict {
  if (rewards.length < 2) return 'too_few_valid';
  if (filter.zero_variance && rewards.every((r) => r === rewards[0])) return 'zero_variance';
  const m = mean(rewards);
  if (filter.min_reward !== undefined && m < filter.min_reward) return 'below_min_reward';
  if (filter.max_reward !== undefined && m > filter.max_reward) return 'above_max_reward';
  return 'kept';
}

/**
 * Drops errored rollouts, filters groups and computes the advantages of the rest. A group keeps
 * working with fewer valid rollouts than it was sampled with; under 2 it has no baseline and is
 * dropped.
 */
export function computeAdvantages(
  groups: readonly (readonly RolloutOutcome[])[],
  cfg: { advantage: AdvantageConfig; filter: FilterConfig },
): AdvantageResult {
  const metrics: AdvantageMetrics = {
    groups: groups.length,
    groups_kept: 0,
    rollouts: 0,
    rollouts_errored: 0,
    rollouts_kept: 0,
    filtered: { too_few_valid: 0, zero_variance: 0, below_min_reward: 0, above_max_reward: 0 },
  };
  const verdicts: GroupVerdict[] = [];
  const advantages = groups.map((group) => {
    metrics.rollouts += group.length;
    const valid: number[] = [];
    group.forEach((r, i) => {
      if (r.errored) metrics.rollouts_errored++;
      else if (!Number.isFinite(r.reward)) throw new Error(`advantages: reward ${r.reward} of a rollout not marked errored`);
      else valid.push(i);
    });
    const rewards = valid.map((i) => group[i].reward);
    const v = verdict(rewards, cfg.filter);
    verdicts.push(v);
    const out: (number | null)[] = group.map(() => null);
    if (v !== 'kept') {
      metrics.filtered[v]++;
      return out;
    }
    const adv = groupAdvantages(rewards, valid.map((i) => group[i].completionTokens), cfg.advantage);
    valid.forEach((i, k) => (out[i] = adv[k]));
    metrics.groups_kept++;
    metrics.rollouts_kept += valid.length;
    return out;
  });
  return { advantages, verdicts, metrics };
}
