/**
 * In-flight mode's decisions, free of I/O (activities/inflight-rollouts.ts does the I/O, on the files of
 * lib/runfolder/inflight-groups.ts):
 *
 *  - which finished groups a step takes (`claimStep`): the groups in the order they finished,
 *    from where the previous step stopped (first those it left over); a group whose oldest token is
 *    more than `max_off_policy_steps` versions behind the step is dropped as stale, one a rollout
 *    filter drops is dropped with the filter's reason, one whose env already has its share of the
 *    step is left for the next step, the rest are taken until the step has its batch_size /
 *    rollouts_per_example groups. A pure function of the groups and the step, so a retried claim
 *    takes the same groups.
 *  - where a restarted producer resumes its draws (`resumeDraw`). How many rollouts it keeps in
 *    flight is the run's ConcurrencyController's (lib/orchestrator/concurrency.ts), within the cap
 *    on groups generated ahead of the steps (`capGroups`).
 */
import type { ClaimCandidate } from '../runfolder/inflight-groups';
import type { FilterMetrics, InFlightClaim } from '../runfolder/rollouts';
import { dropReason, type FilterGroup, type RolloutFilter } from './filters';

/** The oldest policy version of a group's tokens. */
export function groupVersion<R>(c: ClaimCandidate<R>): number {
  const sampled = c.rollouts.map((r) => r.policyVersion).filter((v) => v >= 0);
  return sampled.length > 0 ? Math.min(...sampled) : c.startVersion;
}

/** A group a teacher played (distill type sft): not the policy's samples, so never stale. */
const byTeacher = <R>(c: ClaimCandidate<R>) =>
  c.rollouts.length > 0 && c.rollouts.every((r) => (r as { teacher?: boolean }).teacher === true);

/** How a claim keeps the env mix (`[[env]]` weights). */
export interface ClaimMix<R> {
  /** Groups of each mix entry in the step, summing to its need: strict mode's allocation of that step. */
  quota: readonly number[];
  /** The mix entry a group's example was drawn from. */
  entryOf(c: ClaimCandidate<R>): number;
  /** Most groups left for later steps at once; past it, a group beyond its entry's share is taken. */
  maxDeferred: number;
}

export interface ClaimDecision<R> {
  kept: ClaimCandidate<R>[];
  dropped: { candidate: ClaimCandidate<R>; reason: string }[];
  /** Groups left for the next step, in number order: carried ones not looked at, and those deferred. */
  deferred: ClaimCandidate<R>[];
  /** The fresh candidates looked at (a prefix of them). */
  fresh: ClaimCandidate<R>[];
  /** The step has all its groups. */
  complete: boolean;
}

/** Reason recorded for a stale group in the step's dropped.jsonl. */
export const STALE = 'stale';

/** The producer's cap in groups: `max_rollouts` (default 2 x batch_size) over rollouts_per_example, at least 1. */
export function capGroups(o: {
  batch_size: number;
  rollouts_per_example: number;
  in_flight: { max_rollouts?: number };
}): number {
  return Math.max(1, Math.floor((o.in_flight.max_rollouts ?? 2 * o.batch_size) / o.rollouts_per_example));
}

/**
 * Goes through the groups the previous step left (`carried`), then `fresh` ones (consecutive groups
 * from where the previous step stopped), until `need` are kept. `view` is what the rollout filters
 * see of a group.
 *
 * With `mix`, each mix entry gets its share of the step (`quota`): a group whose entry has its share
 * already is left for the next step, which looks at it first, so groups that finish early (short
 * rollouts) do not crowd out those of their step's slower entries. At most `maxDeferred` groups are
 * left over at once; past that a group is taken beyond its share, so a claim never waits on groups
 * the producer cannot start (its cap counts the groups left over) or an entry whose groups keep
 * being dropped.
 */
export function claimStep<R>(
  step: number,
  carried: readonly ClaimCandidate<R>[],
  fresh: readonly ClaimCandidate<R>[],
  opts: {
    need: number;
    maxOffPolicySteps: number;
    filters: readonly RolloutFilter[];
    view(c: ClaimCandidate<R>): FilterGroup;
    mix?: ClaimMix<R>;
  },
): ClaimDecision<R> {
  const { mix } = opts;
  const kept: ClaimCandidate<R>[] = [];
  const dropped: ClaimDecision<R>['dropped'] = [];
  const deferred: ClaimCandidate<R>[] = [];
  const taken = mix?.quota.map(() => 0);
  let carriedLeft = carried.length;
  let freshLooked = 0;
  for (const c of [...carried, ...fresh]) {
    if (kept.length === opts.need) break;
    if (carriedLeft > 0) carriedLeft--;
    else freshLooked++;
    if (!byTeacher(c) && step - groupVersion(c) > opts.maxOffPolicySteps) {
      dropped.push({ candidate: c, reason: STALE });
      continue;
    }
    const reason = dropReason(opts.filters, opts.view(c));
    if (reason !== undefined) {
      dropped.push({ candidate: c, reason });
      continue;
    }
    if (mix && taken) {
      const entry = mix.entryOf(c);
      if (taken[entry] >= (mix.quota[entry] ?? 0) && deferred.length + carriedLeft < mix.maxDeferred) {
        deferred.push(c);
        continue;
      }
      taken[entry]++;
    }
    kept.push(c);
  }
  deferred.push(...carried.slice(carried.length - carriedLeft));
  deferred.sort((a, b) => a.seq - b.seq);
  return { kept, dropped, deferred, fresh: fresh.slice(0, freshLooked), complete: kept.length === opts.need };
}

/** The claim's record and the filters' metrics (stale groups are not the filters': they count apart). */
export function claimMetrics<R>(
  step: number,
  first: number,
  d: ClaimDecision<R>,
): { inFlight: InFlightClaim; filter: FilterMetrics } {
  const stale = d.dropped.filter((x) => x.reason === STALE);
  const filtered = d.dropped.filter((x) => x.reason !== STALE);
  // Rollouts that sampled nothing (an example that failed to load) have no distance.
  const behind = d.kept.flatMap((c) =>
    byTeacher(c) ? [] : c.rollouts.filter((r) => r.policyVersion >= 0).map((r) => step - r.policyVersion),
  );
  const dropped_by: Record<string, number> = {};
  for (const x of filtered) dropped_by[x.reason] = (dropped_by[x.reason] ?? 0) + 1;
  const staleSet = new Set(stale.map((x) => x.candidate));
  return {
    inFlight: {
      first,
      next: first + d.fresh.length,
      groups: d.kept.map((c) => c.seq),
      deferred: d.deferred.map((c) => c.seq),
      staleGroups: stale.length,
      staleRollouts: stale.reduce((n, x) => n + x.candidate.rollouts.length, 0),
      offPolicyMean: behind.reduce((a, b) => a + b, 0) / Math.max(1, behind.length),
      offPolicyMax: behind.length > 0 ? Math.max(...behind) : 0,
      inferenceIdleSeconds: d.fresh.reduce((a, c) => a + c.idleSeconds, 0),
      concurrencyMean: mean(d.fresh.map((c) => c.concurrency)),
      serverRunningMean: mean(d.fresh.map((c) => c.load?.running)),
      serverWaitingMean: mean(d.fresh.map((c) => c.load?.waiting)),
    },
    filter: {
      // Groups first looked at by this step that reached the filters (carried ones were counted by the step that deferred them).
      groups_generated: d.fresh.filter((c) => !staleSet.has(c)).length,
      groups_dropped: filtered.length,
      dropped_by,
      refill_rounds: 0,
      groups_missing: 0,
    },
  };
}

/** The mean of the recorded values (null: none). */
function mean(values: readonly (number | undefined)[]): number | null {
  const known = values.filter((v): v is number => v !== undefined);
  return known.length > 0 ? known.reduce((a, b) => a + b, 0) / known.length : null;
}

/**
 * The first draw a restarted producer plays: one after the highest stored draw, so no example is
 * played twice. Groups finish out of order, so the newest group need not hold the highest draw; but
 * every group stored after the one that does started before it and was still in flight when it
 * started, and at most `cap` groups are in flight at once: the highest draw is among the newest
 * `cap` groups, and only those are read. `known` holds the stored group numbers, ascending.
 */
export function resumeDraw(known: readonly number[], cap: number, drawOf: (seq: number) => number | undefined): number {
  const draws = known.slice(-cap).map((seq) => drawOf(seq) ?? -1);
  return Math.max(-1, ...draws) + 1;
}
