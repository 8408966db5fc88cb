/**
 * Group advantages (after prime-rl's orchestrator advantage code). Each example is
 * rolled out G times; a rollout's advantage comes from its group's rewards and is broadcast later to
 * all its completion tokens.
 *
 * The estimators form a registry: `BUILTIN_ADVANTAGES` implements each built-in the config names
 * (`ADVANTAGE_TYPES`, lib/config/names.ts; the compiler checks that each has one), and a plugin
 * module (`advantage.import_path`, lib/orchestrator/plugins.ts) becomes the same
 * `AdvantageEstimator` unit, so callers never tell them apart.
 *
 * Built-ins, with R the group's rewards:
 *   grpo:   A_i = R_i - mean(R)
 *   rloo:   A_i = R_i - mean_{j != i} R_j  = G/(G-1) * (R_i - mean(R))
 *   opo:    A_i = R_i - sum_j |o_j| R_j / sum_j |o_j|   (length-weighted; plain mean if every |o_j| is 0)
 *   max_rl: A_i = (R_i - mean(R)) / mean(R), and 0 for every rollout when mean(R) <= 0 (no signal;
 *           MaxRL assumes non-negative rewards)
 * Options of the built-ins:
 *   length_penalty (linear): before the estimator, R_i -= mean(R) * (w_out * out_i / max(out)
 *     + w_in * in_i / max(in) + w_turns * turns_i / max(turns)), each max over the group and at least 1:
 *     out = generated tokens, in = tokens the model read but did not generate (prompt, env turns).
 *   std_norm: divides the advantages by std(R) + 1e-8 with Bessel's correction (n - 1), as torch's
 *     `Tensor.std()`; R are the rewards the estimator saw. Not with max_rl (it normalises by the mean).
 */
import { ADVANTAGE_TYPES, type AdvantageType } from '../config/names';

/** What an estimator sees of one group: its valid (non-errored) rollouts, in order. */
export interface AdvantageGroup {
  rewards: number[];
  /** Tokens the model generated (all assistant turns); OPO's |o_i|. */
  completionTokens: number[];
  /** Tokens the model read but did not generate: the prompt and the environment's turns. */
  inputTokens: number[];
  /** Assistant turns. */
  turns: number[];
}

/** One estimator: the advantages of a group's rollouts, in the group's order. */
export interface AdvantageEstimator {
  /** The built-in's type or the plugin's import_path, for error messages. */
  readonly name: string;
  compute(group: AdvantageGroup): number[];
}

/** Exact for a group of equal rewards (so their advantages are exactly 0, not 1e-17). */
function mean(xs: readonly number[]): number {
  if (xs.every((x) => x === xs[0])) return xs[0];
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

/** The built-in estimators by name, each a function of (rewards, group). */
export const BUILTIN_ADVANTAGES = {
  grpo: (R: number[]) => {
    const b = mean(R);
    return R.map((r) => r - b);
  },
  rloo: (R: number[]) => {
    const m = mean(R);
    return R.map((r) => (R.length / (R.length - 1)) * (r - m));
  },
  opo: (R: number[], g: AdvantageGroup) => {
    const total = g.completionTokens.reduce((s, l) => s + l, 0);
    const b = total > 0 ? R.reduce((s, r, i) => s + r * g.completionTokens[i], 0) / total : mean(R);
    return R.map((r) => r - b);
  },
  max_rl: (R: number[]) => {
    const m = mean(R);
    return m > 0 ? R.map((r) => (r - m) / m) : R.map(() => 0);
  },
} satisfies Record<AdvantageType, (rewards: number[], group: AdvantageGroup) => number[]>;

export interface LengthPenaltyConfig {
  type: 'linear';
  num_output_tokens_weight: number;
  num_input_tokens_weight: number;
  num_turns_weight: number;
}

/** The options of a built-in estimator (the config's `advantage` section without a plugin). */
export interface BuiltinAdvantageConfig {
  type: AdvantageType;
  std_norm: boolean;
  length_penalty?: LengthPenaltyConfig;
}

const STD_EPS = 1e-8;

/** The linear length penalty's shaped rewards. */
export function lengthPenalized(g: AdvantageGroup, p: LengthPenaltyConfig): number[] {
  const frac = (xs: number[]) => {
    const max = Math.max(1, ...xs);
    return xs.map((x) => x / max);
  };
  const out = frac(g.completionTokens);
  const inp = frac(g.inputTokens);
  const turns = frac(g.turns);
  const passRate = mean(g.rewards);
  return g.rewards.map(
    (r, i) =>
      r -
      passRate *
        (p.num_output_tokens_weight * out[i] + p.num_input_tokens_weight * inp[i] + p.num_turns_weight * turns[i]),
  );
}

export function builtinEstimator(cfg: BuiltinAdvantageConfig): AdvantageEstimator {
  const fn = BUILTIN_ADVANTAGES[cfg.type];
  if (!fn) throw new Error(`unknown advantage type "${cfg.type}" (one of ${ADVANTAGE_TYPES.join(', ')})`);
  return {
    name: cfg.type,
    compute(g) {
      const R = cfg.length_penalty ? lengthPenalized(g, cfg.length_penalty) : g.rewards;
      let adv = fn(R, g);
      if (cfg.std_norm) {
        const std = sampleStd(R);
        adv = adv.map((a) => a / (std + STD_EPS));
      }
      return adv;
    },
  };
}

/** Advantages of one group of valid rollouts (at least 2). */
export function groupAdvantages(estimator: AdvantageEstimator, g: AdvantageGroup): number[] {
  const n = g.rewards.length;
  if (n < 2) throw new Error(`advantages need at least 2 rollouts per group, got ${n}`);
  for (const k of ['completionTokens', 'inputTokens', 'turns'] as const) {
    if (g[k].length !== n) throw new Error(`advantages: ${n} rewards but ${g[k].length} ${k}`);
  }
  return estimator.compute(g);
}

export interface RolloutOutcome {
  reward: number;
  completionTokens: number;
  /** Tokens read but not generated (prompt, env turns); 0 when unknown. */
  inputTokens?: number;
  turns?: number;
  /** The rollout failed (env error, timeout, crash, inference error): excluded before grouping. */
  errored?: boolean;
}

export type GroupVerdict = 'kept' | 'too_few_valid';

export interface AdvantageMetrics {
  groups: number;
  groups_kept: number;
  /** Groups with fewer than 2 valid rollouts: no baseline, not trained on. */
  groups_too_few_valid: number;
  rollouts: number;
  rollouts_errored: number;
  /** Rollouts trained on: the valid rollouts of kept groups, less those dropped for a zero advantage. */
  rollouts_kept: number;
  /** Rollouts of kept groups whose advantage is exactly 0, dropped (`filter_zero_advantages`). */
  zero_advantage_rollouts: number;
  /** Their generated tokens: the zero-advantage tokens that were not trained on. */
  zero_advantage_tokens: number;
}

/** Metrics of no group: what a step's sum starts from. */
export const emptyAdvantageMetrics = (): AdvantageMetrics => ({
  groups: 0,
  groups_kept: 0,
  groups_too_few_valid: 0,
  rollouts: 0,
  rollouts_errored: 0,
  rollouts_kept: 0,
  zero_advantage_rollouts: 0,
  zero_advantage_tokens: 0,
});

export interface AdvantageResult {
  /** Same shape as the input: the advantage of each rollout, or null when it is not trained on. */
  advantages: (number | null)[][];
  verdicts: GroupVerdict[];
  metrics: AdvantageMetrics;
}

export interface AdvantageOptions {
  /** Rollouts whose advantage is exactly 0 are not trained on (they carry no policy-gradient signal). */
  dropZeroAdvantage: boolean;
}

/**
 * Drops errored rollouts and computes the advantages of each group's valid ones. A group keeps
 * working with fewer valid rollouts than it was sampled with; under 2 it has no baseline and is
 * dropped. (Groups are judged by the rollout filters when they are generated, activities/generate-rollouts.ts.)
 */
export function computeAdvantages(
  groups: readonly (readonly RolloutOutcome[])[],
  estimator: AdvantageEstimator,
  opts: AdvantageOptions,
): AdvantageResult {
  const metrics = { ...emptyAdvantageMetrics(), groups: groups.length };
  const verdicts: GroupVerdict[] = [];
  const advantages = groups.map((group) => {
    metrics.rollouts += group.length;
    const valid: RolloutOutcome[] = [];
    const at: number[] = [];
    group.forEach((r, i) => {
      if (r.errored) metrics.rollouts_errored++;
      else if (!Number.isFinite(r.reward))
        throw new Error(`advantages: reward ${r.reward} of a rollout not marked errored`);
      else (valid.push(r), at.push(i));
    });
    const out: (number | null)[] = group.map(() => null);
    if (valid.length < 2) {
      verdicts.push('too_few_valid');
      metrics.groups_too_few_valid++;
      return out;
    }
    verdicts.push('kept');
    const adv = groupAdvantages(estimator, {
      rewards: valid.map((r) => r.reward),
      completionTokens: valid.map((r) => r.completionTokens),
      inputTokens: valid.map((r) => r.inputTokens ?? 0),
      turns: valid.map((r) => r.turns ?? 0),
    });
    metrics.groups_kept++;
    adv.forEach((a, k) => {
      if (a === 0 && opts.dropZeroAdvantage) {
        metrics.zero_advantage_rollouts++;
        metrics.zero_advantage_tokens += valid[k].completionTokens;
        return;
      }
      out[at[k]] = a;
      metrics.rollouts_kept++;
    });
    return out;
  });
  return { advantages, verdicts, metrics };
}

/**
 * RAE, role-conditioned advantage estimation (SPIRAL, arXiv:2506.24119): the advantage of a
 * trained trace is its reward minus the baseline of its key (environment and agent: in self-play
 * the agents' rewards have opposite scales, so each is measured against its own), and then that
 * baseline moves toward the reward: b <- decay x b + (1 - decay) x reward. Baselines start at 0.
 * The traces are taken in the order given (a step's groups in order, each group's rollouts, each
 * rollout's traces), so a step's advantages are a pure function of the baselines before it and its
 * rollouts. `baselines` is updated in place.
 */
export function raeAdvantages(
  traces: readonly { key: string; reward: number }[],
  baselines: Record<string, number>,
  decay: number,
): number[] {
  if (!(decay >= 0 && decay < 1)) throw new Error(`rae: decay must be in [0, 1), got ${decay}`);
  return traces.map(({ key, reward }) => {
    if (!Number.isFinite(reward)) throw new Error(`rae: reward ${reward} of ${key}`);
    const b = baselines[key] ?? 0;
    baselines[key] = decay * b + (1 - decay) * reward;
    return reward - b;
  });
}
