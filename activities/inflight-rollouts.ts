/**
 * In-flight mode (orchestrator.in_flight.enabled), the cpu side:
 *
 *  - `produceRollouts`: one long, heartbeating activity per workflow execution that runs the
 *    producer (lib/orchestrator/producer.ts), which generates groups continuously. Before starting
 *    each group it makes the servers serve the newest policy in `weights/` (they take it between
 *    two decode steps, requests in flight); each finished group is written once as
 *    `inflight/groups/<G>.json`, G the next free number (lib/runfolder/inflight-groups.ts `publishGroup`:
 *    two producers, e.g. one retried while the old attempt still runs, never share a number and
 *    never leave a gap). Groups it had in flight when it died are lost: no step had taken them.
 *  - `claimRollouts(step)`: takes the step's groups from those step - 1 left over (its summary's
 *    `inFlight.deferred`) and then from where it stopped (`inFlight.next`), in number order
 *    (lib/orchestrator/inflight-decisions.ts decides; with keep_mix, each env gets its share of the step),
 *    and writes them as the step's rollouts folder, in generateRollouts' format, so packing and
 *    training are the same in both modes. The folder's summary is the claim: a retry returns it,
 *    so a group is taken by one step only and a step's groups never change.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { Failure } from '../lib/failures';
import type { EnvPool } from '../lib/envs/pool';
import { EnvMix } from '../lib/envs/mix';
import * as groups from '../lib/orchestrator/groups';
import { claimMetrics, capGroups, claimStep, type ClaimMix } from '../lib/orchestrator/inflight-decisions';
import { Producer } from '../lib/orchestrator/producer';
import { readGroup, writeConsumed, type StoredGroup } from '../lib/runfolder/inflight-groups';
import { RunLayout } from '../lib/runfolder/layout';
import { storedSummary, writeStepRollouts, type RolloutSummary, type StoredRollout } from '../lib/runfolder/rollouts';
import { withHeartbeat } from '../lib/temporal/heartbeat';

/** How often a waiting claim looks at the run folder. */
const POLL_MS = 100;

/**
 * keep_mix: each mix entry's share of `step` (strict mode's allocation of the step), the entry a
 * group was drawn from (its draw's), and at most one step of groups left over, fewer than the
 * producer's cap (which counts them), so the producer can always start the group a claim waits for.
 */
function mixShares(ctx: groups.RolloutContext, step: number, cap: number): ClaimMix<StoredRollout> {
  const perStep = ctx.examplesPerStep;
  const mix = new EnvMix(ctx.mixEntries, { seed: ctx.config.seed, examplesPerStep: perStep });
  // The entry of each draw of a step, sampled once per step (a claim is decided again as groups
  // arrive, and its candidates come from a few steps' draws).
  const entries = new Map<number, number[]>();
  const entriesOf = (s: number) => {
    let e = entries.get(s);
    if (!e) entries.set(s, (e = mix.sample(s).map((d) => d.env)));
    return e;
  };
  const quota = ctx.mixEntries.map(() => 0);
  for (const env of entriesOf(step)) quota[env]++;
  return {
    quota,
    entryOf: (c) => {
      const { draw } = c as StoredGroup; // the claim's candidates are stored groups
      return entriesOf(Math.floor(draw / perStep))[draw % perStep];
    },
    maxDeferred: Math.min(perStep, cap - 1),
  };
}

export interface ProduceInput {
  runDir: string;
}

export interface ClaimInput {
  runDir: string;
  step: number;
}

export function createInFlightActivities({ pool }: { pool: EnvPool }) {
  return {
    /** Generates until cancelled (the workflow cancels it when it ends or continues as new). */
    async produceRollouts({ runDir }: ProduceInput): Promise<void> {
      const cancelled = Context.current().cancellationSignal;
      const producer = new Producer(runDir, await groups.rolloutContext(runDir, pool), pool, cancelled);
      try {
        await withHeartbeat(
          () => producer.status(),
          () => producer.run(),
        );
      } catch (e) {
        if (!cancelled.aborted) throw groups.rolloutFailure(e);
      }
    },

    /** Step `step`'s groups: the stored claim, or the next ones as they finish (waits for them). */
    async claimRollouts({ runDir, step }: ClaimInput): Promise<RolloutSummary> {
      const stored = storedSummary(runDir, step);
      if (stored) return stored;
      const layout = new RunLayout(runDir);
      const started = Date.now();
      const ctx = await groups.rolloutContext(runDir, pool);
      const o = ctx.config.orchestrator;
      const filters = groups.loadFilters(ctx);
      const previous = step > 0 ? storedSummary(runDir, step - 1)?.inFlight : undefined;
      const first = previous?.next ?? 0;
      const carried = (previous?.deferred ?? []).map((seq) => {
        const group = readGroup(layout, seq);
        if (!group)
          throw ApplicationFailure.nonRetryable(
            `in-flight group ${seq}, left by step ${step - 1} for step ${step}, is missing from ${layout.inflightGroupsDir}`,
            Failure.RunFolderDamaged,
          );
        return group;
      });
      const mix = o.in_flight.keep_mix ? mixShares(ctx, step, capGroups(o)) : undefined;
      const fresh: StoredGroup[] = [];
      const decide = () =>
        claimStep(step, carried, fresh, {
          need: ctx.examplesPerStep,
          maxOffPolicySteps: o.in_flight.max_off_policy_steps,
          filters,
          view: (c) => groups.filterView(c.rollouts as StoredRollout[]),
          mix,
        });
      const consumedAs = (next: number, deferred: number) => writeConsumed(layout, { step, next, deferred });
      let decision = decide();
      await withHeartbeat(
        () => ({
          phase: 'waiting for rollouts',
          step,
          looked: decision.fresh.length,
          kept: decision.kept.length,
          deferred: decision.deferred.length,
        }),
        async () => {
          while (!decision.complete) {
            const next = readGroup(layout, first + fresh.length);
            if (next) {
              fresh.push(next);
              decision = decide();
              continue;
            }
            // Tell the producer how far this claim has looked: those groups no longer wait, except
            // the ones left for the next step.
            consumedAs(first + fresh.length, decision.deferred.length);
            await sleep(POLL_MS);
          }
        },
      );
      const { inFlight, filter } = claimMetrics(step, first, decision);
      consumedAs(inFlight.next, inFlight.deferred.length);
      const kept = decision.kept.map((c) => c.rollouts as StoredRollout[]);
      const dropped = decision.dropped.map((x) => ({
        group: x.candidate.rollouts as StoredRollout[],
        reason: x.reason,
      }));
      const versions = kept
        .flat()
        .map((r) => r.policyVersion)
        .filter((v) => v >= 0);
      const dir = layout.rolloutsDir(step);
      const summary: RolloutSummary = {
        ...groups.summarize(
          step,
          dir,
          versions.length > 0 ? Math.min(...versions) : 0,
          { kept, dropped, metrics: filter },
          (Date.now() - started) / 1000,
        ),
        inFlight,
      };
      writeStepRollouts(dir, kept, dropped, summary);
      return summary;
    },
  };
}
