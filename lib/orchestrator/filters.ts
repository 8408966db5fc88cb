/**
 * Rollout filters and the refill of a step's batch.
 *
 * A filter judges a whole group (one example's G rollouts) when it has been generated: it keeps it
 * or names why it drops it. The built-in `difficulty` filter (`orchestrator.difficulty_filter`) and
 * plugin filters (`orchestrator.rollout_filters`, lib/orchestrator/plugins.ts) are the same
 * `RolloutFilter` unit. Dropped groups are replaced by fresh examples, round after round, so that
 * the step still trains on batch_size rollouts; after `max_refill_rounds` rounds the step trains on
 * what it has (`groups_missing` says how many groups short).
 *
 * Determinism: the fresh examples of refill round r of step n are a pure function of (seed, n, r,
 * how many are needed) (`refillDraws`), and the rollouts activity redoes a crashed step from scratch,
 * so a retry plays the same requests and writes the same step.
 */
import { EnvMix, type MixDraw, type MixEntry } from '../envs/mix';
import { hash32 } from '../envs/random';
import type { FilterMetrics } from '../runfolder/rollouts';

/** What a filter sees of one group. */
export interface FilterGroup {
  /** Environment id and example index of the group's example. */
  env: string;
  exampleIndex: number;
  /** Slot of the group in its step (refill groups continue after the first round's). */
  group: number;
  /** 0 for the step's own examples, r for the r-th refill round. */
  round: number;
  /** Rewards of the valid (non-errored) rollouts. */
  rewards: number[];
  /** Generated tokens of the valid rollouts. */
  completionTokens: number[];
  /** Rollouts that errored (they have no reward). */
  errored: number;
  /** The [[env]] entry of the group (its gates); absent in groups stored before it was recorded. */
  envIndex?: number;
  /** Tokens the valid rollouts read but did not generate, and their turns (the length penalty's). */
  inputTokens?: number[];
  turns?: number[];
}

export interface RolloutFilter {
  /** `difficulty` or the plugin's import_path. */
  readonly name: string;
  /** Why the group is dropped (a metric key), or undefined to keep it. */
  check(group: FilterGroup): string | undefined;
}

/** Same shape as the config's `orchestrator.difficulty_filter`. */
export interface DifficultyFilterConfig {
  enabled: boolean;
  min_reward_variance: number;
  min_reward?: number;
  max_reward?: number;
}

/** Population variance (divided by n): the spread of the group's rewards. */
export function rewardVariance(rewards: readonly number[]): number {
  const m = rewards.reduce((s, r) => s + r, 0) / rewards.length;
  return rewards.reduce((s, r) => s + (r - m) * (r - m), 0) / rewards.length;
}

/**
 * The difficulty filter: drops groups with no reward spread (all rewards equal, or a population
 * variance below min_reward_variance) and groups whose mean reward is outside [min_reward,
 * max_reward]. Groups with fewer than 2 valid rollouts are not its business (errors, not
 * difficulty): packing drops them. Each group counts under its first failing check, in this order.
 */
export function difficultyFilter(cfg: DifficultyFilterConfig): RolloutFilter {
  return {
    name: 'difficulty',
    check({ rewards }) {
      if (!cfg.enabled || rewards.length < 2) return undefined;
      if (rewards.every((r) => r === rewards[0]) || rewardVariance(rewards) < cfg.min_reward_variance)
        return 'reward_variance';
      const m = rewards.reduce((s, r) => s + r, 0) / rewards.length;
      if (cfg.min_reward !== undefined && m < cfg.min_reward) return 'min_reward';
      if (cfg.max_reward !== undefined && m > cfg.max_reward) return 'max_reward';
      return undefined;
    },
  };
}

export interface FilteredGroups<G> {
  kept: G[];
  dropped: { group: G; reason: string }[];
  metrics: FilterMetrics;
}

export interface RefillOptions<G> {
  /** Groups of the step (batch_size / rollouts_per_example). */
  groups: number;
  maxRefillRounds: number;
  filters: readonly RolloutFilter[];
  /** Plays `count` groups of `round`, numbered from slot `firstSlot`. */
  play(round: number, firstSlot: number, count: number): Promise<G[]>;
  view(group: G): FilterGroup;
}

/** The first filter's reason for dropping `g` (`<filter>/<reason>`), or undefined when all keep it. */
export function dropReason(filters: readonly RolloutFilter[], g: FilterGroup): string | undefined {
  for (const f of filters) {
    const reason = f.check(g);
    if (reason !== undefined) return `${f.name}/${reason}`;
  }
  return undefined;
}

/** Plays the step's groups, drops what the filters drop and refills, at most maxRefillRounds times. */
export async function playFiltered<G>(opts: RefillOptions<G>): Promise<FilteredGroups<G>> {
  const kept: G[] = [];
  const dropped: { group: G; reason: string }[] = [];
  const metrics: FilterMetrics = {
    groups_generated: 0,
    groups_dropped: 0,
    dropped_by: {},
    refill_rounds: 0,
    groups_missing: 0,
  };
  let slot = 0;
  for (let round = 0; ; round++) {
    const count = opts.groups - kept.length;
    if (count === 0 || round > opts.maxRefillRounds) break;
    if (round > 0) metrics.refill_rounds = round;
    const played = await opts.play(round, slot, count);
    slot += count;
    metrics.groups_generated += played.length;
    for (const g of played) {
      const reason = dropReason(opts.filters, opts.view(g));
      if (reason === undefined) kept.push(g);
      else {
        dropped.push({ group: g, reason });
        metrics.groups_dropped++;
        metrics.dropped_by[reason] = (metrics.dropped_by[reason] ?? 0) + 1;
      }
    }
  }
  metrics.groups_missing = opts.groups - kept.length;
  return { kept, dropped, metrics };
}

/**
 * Examples of refill rounds: a second env mix (same weights, its own seed) whose "step" is
 * (step, round), so refill examples are drawn without replacement from their own stream and a
 * retried step draws the same ones. They may repeat examples of the main stream.
 */
export function refillDraws(
  entries: readonly MixEntry[],
  opts: { seed: number; examplesPerStep: number; maxRefillRounds: number },
) {
  const mix = new EnvMix(entries, { seed: hash32(`${opts.seed}/refill`), examplesPerStep: opts.examplesPerStep });
  return (step: number, round: number, count: number): MixDraw[] => {
    if (round < 1 || round > opts.maxRefillRounds)
      throw new Error(`refill round ${round} is outside 1..${opts.maxRefillRounds}`);
    if (count > opts.examplesPerStep)
      throw new Error(`refill of ${count} groups: at most ${opts.examplesPerStep} per round`);
    return mix.sample(step * opts.maxRefillRounds + round - 1).slice(0, count);
  };
}
