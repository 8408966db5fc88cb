/**
 * The environments of an eval plan, from config entries: each may have its own number of examples
 * and k (prime-rl's eval sources each have their own). Pure (no Node built-ins): workflow code
 * builds plans with it.
 */
export interface EvalEnv {
  id: string;
  args?: Record<string, unknown>;
  /** Held-out examples of this environment (-1: all); unset = the plan's. */
  numExamples?: number;
  /** k of avg@k / pass@k for this environment; unset = the plan's. */
  rolloutsPerExample?: number;
}

export interface EvalEnvEntry {
  id: string;
  args?: Record<string, unknown>;
  num_examples?: number;
  rollouts_per_example?: number;
}

export function evalEnvs(entries: readonly EvalEnvEntry[]): EvalEnv[] {
  return entries.map((e) => ({
    id: e.id,
    args: e.args,
    ...(e.num_examples !== undefined ? { numExamples: e.num_examples } : {}),
    ...(e.rollouts_per_example !== undefined ? { rolloutsPerExample: e.rollouts_per_example } : {}),
  }));
}

/** Examples an environment plays: its own count or the plan's, -1 = its whole eval split. */
export function evalExampleCount(wanted: number, evalSplit: number | undefined, envId: string): number {
  if (wanted >= 0) return Math.min(wanted, evalSplit ?? Infinity);
  if (evalSplit === undefined)
    throw new Error(
      `environment ${envId} has an unbounded eval split: num_examples = -1 (all) cannot be played; give a count`,
    );
  return evalSplit;
}
