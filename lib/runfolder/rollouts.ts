/**
 * A step's rollouts folder, `rollouts/step_N/`, written at once (temp + rename) by `generateRollouts`
 * or, in in-flight mode, `claimRollouts`:
 *
 *   rollouts.jsonl  the groups the rollout filters kept, one rollout (`StoredRollout`) a line: what packing reads
 *   dropped.jsonl   the groups they dropped, each rollout with `dropped`: the filter's reason
 *   summary.json    the step's `RolloutSummary`, written last: the folder's done-marker, returned by a retry
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { storedResult, writeDirAtomic } from '../atomic';
import type { Message } from '../envs/types';
import { RunLayout } from './layout';
import type { TokenSegment } from './packing';

/** An environment's example played and scored (lib/orchestrator/episode.ts): a rollout, or an eval's episode. */
export interface Episode {
  /** The conversation after the prompt: assistant turns and environment replies. */
  completion: Message[];
  reward: number;
  metrics: Record<string, number>;
  /** Assistant turns played. */
  turns: number;
  /** Set when the episode failed; it is then kept out of training and scores 0 in evals. */
  error?: string;
}

/** A token rollout (lib/orchestrator/token-rollout.ts): an episode with the exact tokens the policy sampled. */
export interface Rollout extends Episode {
  /**
   * The training samples, in order, each its token segments (prompt, turn 1, env reply 1, turn 2,
   * ...): one sample while the chat template keeps the prefix property, a new one from each turn
   * where it does not. Only samples with a sampled token (not a re-rendered chat too long to
   * sample from); an errored rollout's are never trained on.
   */
  samples: TokenSegment[][];
  /** Tokens the model sampled over all turns. */
  completionTokens: number;
  /** The rollout ran out of context before the environment ended it. */
  truncated: boolean;
  /** Lowest policy version that produced any of the tokens (-1: none sampled). */
  policyVersion: number;
  /** Highest policy version that produced any of the tokens (-1: none sampled); above `policyVersion` only when weights changed mid-rollout (in-flight mode). */
  newestPolicyVersion: number;
  /**
   * A multi-agent episode's traces, in the order of `samples`: each agent's name, its reward and
   * how many of the samples are its (rae's baselines are per agent). Absent: one agent, the
   * rollout's reward.
   */
  traces?: { agent: string; reward: number; samples: number }[];
}

/** One stored rollout: the packing input plus what a person inspecting the run wants to read. */
export interface StoredRollout extends Rollout {
  env: string;
  /** The [[env]] entry it was drawn from (several may share an id; absent in older runs). */
  envIndex?: number;
  /** Played by a teacher (distill type sft), not the policy: never stale in in-flight mode. */
  teacher?: boolean;
  /** Slot of the group in the step; refill groups continue after the step's own. */
  group: number;
  /** 0 for the step's own examples, r for refill round r (lib/orchestrator/filters.ts). */
  round: number;
  exampleIndex: number;
  sample: number;
  seed: number;
}

/** Per-step metrics of the rollout filters (lib/orchestrator/filters.ts). */
export interface FilterMetrics {
  /** Groups generated, over all rounds. */
  groups_generated: number;
  /** Groups dropped by a filter, in all, and by reason (`<filter>/<reason>`). */
  groups_dropped: number;
  dropped_by: Record<string, number>;
  /** Refill rounds played (0 when nothing was dropped). */
  refill_rounds: number;
  /** Groups the step is still short of after the last refill round. */
  groups_missing: number;
}

/** The in-flight part of a step's rollout summary (recorded in metrics.jsonl). */
export interface InFlightClaim {
  /** Groups [first, next) were looked at for the first time; the next step goes on at `next`. */
  first: number;
  next: number;
  /** The groups the step trains on. */
  groups: number[];
  /** Groups left for the next step, which looks at them first (their mix entry's share of this step was full). */
  deferred: number[];
  /** Groups (and their rollouts) dropped for being more than max_off_policy_steps versions behind. */
  staleGroups: number;
  staleRollouts: number;
  /** Versions behind the step of the rollouts it trains on (step - oldest token's version): mean and max (0 when none sampled). */
  offPolicyMean: number;
  offPolicyMax: number;
  /** Seconds the producer had nothing to generate while the groups [first, next) were made. */
  inferenceIdleSeconds: number;
  /** Means over the groups [first, next), as they finished: the producer's concurrency limit (in rollouts) and the servers' running and queued sequences (null: not recorded). */
  concurrencyMean: number | null;
  serverRunningMean: number | null;
  serverWaitingMean: number | null;
}

export interface RolloutSummary {
  step: number;
  path: string;
  policyVersion: number;
  /** Rollouts generated, refills and dropped groups included (as errored, truncated, the rewards, rubric and tokens). */
  rollouts: number;
  errored: number;
  truncated: number;
  rewardMean: number;
  rewardStd: number;
  /** Mean of each rubric function over valid rollouts. */
  rubric: Record<string, number>;
  completionTokens: number;
  seconds: number;
  /** The first few errors, for the UI. */
  errors: string[];
  /** The rollout filters: groups dropped (by reason), refill rounds, groups still missing. */
  filter: FilterMetrics;
  /** In-flight mode: the groups the step took and their off-policy distance (from lib/runfolder/inflight-groups.ts). */
  inFlight?: InFlightClaim;
}

/** The groups the rollout filters dropped, each rollout with `dropped`: the filter's reason. */
const DROPPED = 'dropped.jsonl';

/** The rollouts of a step's folder, one JSON line each. */
export function rolloutsFile(dir: string): string {
  return path.join(dir, RunLayout.ROLLOUTS_FILE);
}

/** The rollouts a step's folder `dir` keeps for packing. */
export function readRollouts(dir: string): StoredRollout[] {
  return fs
    .readFileSync(rolloutsFile(dir), 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as StoredRollout);
}

/**
 * Writes a step's rollouts folder at once (temp + rename): the kept groups for packing, the dropped
 * ones (each rollout with `dropped`: the filter's reason) beside them, and the summary last read
 * back by a retry.
 */
export function writeStepRollouts(
  dir: string,
  kept: readonly StoredRollout[][],
  dropped: readonly { group: StoredRollout[]; reason: string }[],
  summary: RolloutSummary,
  extra: (tmp: string) => void = () => {},
): void {
  writeDirAtomic(dir, (tmp) => {
    const lines = (groups: readonly (readonly object[])[]) =>
      groups
        .flat()
        .map((r) => JSON.stringify(r) + '\n')
        .join('');
    fs.writeFileSync(path.join(tmp, RunLayout.ROLLOUTS_FILE), lines(kept));
    fs.writeFileSync(
      path.join(tmp, DROPPED),
      lines(dropped.map((d) => d.group.map((r) => ({ ...r, dropped: d.reason })))),
    );
    extra(tmp);
    fs.writeFileSync(path.join(tmp, RunLayout.ROLLOUTS_SUMMARY), JSON.stringify(summary, null, 1));
  });
}

/** A step's stored summary (its rollouts folder is complete), or undefined. */
export function storedSummary(runDir: string, step: number): RolloutSummary | undefined {
  return storedResult<RolloutSummary>(new RunLayout(runDir).rolloutsSummaryFile(step));
}
