/**
 * In-flight mode's files (lib/orchestrator/inflight-decisions.ts decides, activities/inflight-rollouts.ts produces and
 * claims):
 *
 *   inflight/groups/G.json   finished group number G (`StoredGroup`), written once under the next
 *                            free number (`publishGroup`): never replaced, never a gap
 *   inflight/consumed.json   how far the claims have looked, and how many groups they left over
 *                            (advisory: the producer's backpressure)
 *
 * A step's claim itself is its rollouts folder (lib/runfolder/rollouts.ts), whose summary records
 * the groups it took (`InFlightClaim`, declared there with the summary).
 */
import * as fs from 'node:fs';
import { storedResult, writeFileAtomic, writeFileExclusive } from '../atomic';
import { listGroups, listSteps, type RunLayout } from './layout';
import type { StoredRollout } from './rollouts';

/** How busy an inference server is (lib/orchestrator/server-load.ts reads it from `/metrics`). */
export interface ServerLoad {
  /** Sequences (or requests, on servers that count those) in the running batch. */
  running: number;
  /** Sequences waiting for a slot in the running batch: above 0, the batch is full. */
  waiting: number;
}

/** What a claim needs to know of a finished group. */
export interface ClaimCandidate<R> {
  seq: number;
  /** The group's rollouts, each with the oldest version of its tokens (-1: none sampled). */
  rollouts: readonly (R & { policyVersion: number })[];
  /** The version the producer served when it started the group: the group's version where no rollout sampled a token. */
  startVersion: number;
  /** Seconds the producer had nothing in flight before it finished this group (inference idle time). */
  idleSeconds: number;
  /** The producer's concurrency limit when the group finished (absent in groups stored before it was recorded). */
  concurrency?: number;
  /** The servers' load in the producer's last reading before the group finished (absent: none). */
  load?: ServerLoad;
}

/** One finished group as the producer stores it. */
export interface StoredGroup extends ClaimCandidate<StoredRollout> {
  /** Draw number: example d of the producer's stream (env mix step floor(d / groups per step)). */
  draw: number;
  rollouts: StoredRollout[];
  finishedAt: number;
}

/** Numbers of the stored groups, ascending. */
export function groupNumbers(layout: RunLayout): number[] {
  let names: string[] = [];
  try {
    names = fs.readdirSync(layout.inflightGroupsDir);
  } catch {
    return [];
  }
  return listGroups(names);
}

/** Stored group `seq`, or undefined while it is not written. */
export function readGroup(layout: RunLayout, seq: number): StoredGroup | undefined {
  return storedResult<StoredGroup>(layout.inflightGroupFile(seq));
}

/**
 * Stores `group` under the first free number from `from` (`writeFileExclusive`: two producers, e.g.
 * one retried while the old attempt still runs, never share a number and never leave a gap), and
 * returns that number.
 */
export function publishGroup(layout: RunLayout, group: Omit<StoredGroup, 'seq'>, from: number): number {
  let seq = from;
  while (!writeFileExclusive(layout.inflightGroupFile(seq), JSON.stringify({ ...group, seq }))) seq++;
  return seq;
}

/**
 * Where the claims stand, as the last one wrote it (advisory: the producer's backpressure): the
 * first group not looked at yet, and how many looked-at groups were left for the next step.
 */
export interface Consumed {
  step: number;
  next: number;
  deferred: number;
}

export function readConsumed(layout: RunLayout): Pick<Consumed, 'next' | 'deferred'> {
  const c = storedResult<Partial<Consumed>>(layout.inflightConsumedFile);
  return { next: c?.next ?? 0, deferred: c?.deferred ?? 0 };
}

export function writeConsumed(layout: RunLayout, consumed: Consumed): void {
  writeFileAtomic(layout.inflightConsumedFile, JSON.stringify(consumed));
}

/** The newest policy version with weights in the run folder (0: the base model). */
export function newestVersion(layout: RunLayout): number {
  let names: string[] = [];
  try {
    names = fs.readdirSync(layout.weightsRoot);
  } catch {
    // no weights yet
  }
  const steps = listSteps(names);
  return steps.length > 0 ? steps[steps.length - 1] : 0;
}
