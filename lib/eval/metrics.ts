/**
 * Eval metrics of one environment from k samples per example: avg@k (mean over examples of the mean
 * reward of their k samples), pass@k for binary rewards (unbiased estimator of Chen et al. 2021),
 * the reward spread and the mean completion length.
 */

/** The k samples of one example. */
export interface EvalExample {
  rewards: readonly number[];
  /** Tokens the model generated for each sample (same order as `rewards`). */
  completionTokens: readonly number[];
}

export interface EnvEvalMetrics {
  num_examples: number;
  /** k: samples per example. */
  rollouts_per_example: number;
  avg_at_k: number;
  /** Population std of all samples' rewards. */
  reward_std: number;
  /** pass@k for k = 1, 2, 4, ... up to and including the samples per example; null unless every reward is 0 or 1. */
  pass_at_k: Record<string, number> | null;
  completion_tokens_mean: number;
}

/**
 * Probability that at least one of k samples drawn without replacement from n (c of them correct)
 * is correct: 1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1..n} (1 - k/i), which never
 * forms the (huge) binomials.
 */
export function passAtK(n: number, c: number, k: number): number {
  if (
    !Number.isInteger(n) ||
    !Number.isInteger(c) ||
    !Number.isInteger(k) ||
    n < 1 ||
    c < 0 ||
    c > n ||
    k < 1 ||
    k > n
  ) {
    throw new Error(`pass@k needs integers 0 <= c <= n and 1 <= k <= n, got n=${n} c=${c} k=${k}`);
  }
  if (n - c < k) return 1;
  let fail = 1;
  for (let i = n - c + 1; i <= n; i++) fail *= 1 - k / i;
  return 1 - fail;
}

/** 1, 2, 4, ... below n, then n itself. */
export function passAtKValues(n: number): number[] {
  const ks: number[] = [];
  for (let k = 1; k < n; k *= 2) ks.push(k);
  ks.push(n);
  return ks;
}

const mean = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

export function summarizeEnvEval(examples: readonly EvalExample[]): EnvEvalMetrics {
  if (examples.length === 0) throw new Error('eval metrics: no examples');
  const k = examples[0].rewards.length;
  for (const [i, e] of examples.entries()) {
    if (e.rewards.length !== k || k === 0)
      throw new Error(
        `eval metrics: example ${i} has ${e.rewards.length} samples, expected ${k} (every example needs the same k >= 1)`,
      );
    if (e.completionTokens.length !== k)
      throw new Error(
        `eval metrics: example ${i} has ${e.rewards.length} rewards but ${e.completionTokens.length} token counts`,
      );
  }
  const rewards = examples.flatMap((e) => e.rewards);
  if (!rewards.every(Number.isFinite)) throw new Error('eval metrics: rewards must be finite numbers');
  const avg = mean(examples.map((e) => mean(e.rewards)));
  const overall = mean(rewards);
  const binary = rewards.every((r) => r === 0 || r === 1);
  let passAt: Record<string, number> | null = null;
  if (binary) {
    passAt = {};
    for (const kk of passAtKValues(k)) {
      passAt[String(kk)] = mean(examples.map((e) => passAtK(k, e.rewards.filter((r) => r === 1).length, kk)));
    }
  }
  return {
    num_examples: examples.length,
    rollouts_per_example: k,
    avg_at_k: avg,
    reward_std: Math.sqrt(mean(rewards.map((r) => (r - overall) ** 2))),
    pass_at_k: passAt,
    completion_tokens_mean: mean(examples.flatMap((e) => e.completionTokens)),
  };
}
