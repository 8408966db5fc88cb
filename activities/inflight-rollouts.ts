/**
 * In-flight mode (orchestrator.in_flight.enabled), the cpu side:
 *
 *  - `produceRollouts`: one long, heartbeating activity per workflow execution that generates
 *    groups continuously. Before starting each group it makes the servers serve the newest policy
 *    in `weights/` (they take it between two decode steps, requests in flight); each finished group
 *    is written once as `inflight/groups/<G>.json`, G the next free number (lib/runfolder/inflight-groups.ts `publishGroup`:
 *    two producers, e.g. one retried while the old attempt still runs, never share a number and
 *    never leave a gap). Groups it had in flight when it died are lost: no step had taken them.
 *  - `claimRollouts(step)`: takes the step's groups from those step - 1 left over (its summary's
 *    `inFlight.deferred`) and then from where it stopped (`inFlight.next`), in number order
 *    (lib/orchestrator/inflight-decisions.ts decides; with keep_mix, each env gets its share of the step),
 *    and writes them as the step's rollouts folder, in generateRollouts' format, so packing and
 *    training are the same in both modes. The folder's summary is the claim: a retry returns it,
 *    so a group is taken by one step only and a step's groups never change.
 */
import * as fs from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { Failure } from '../lib/failures';
import type { EnvPool } from '../lib/envs/pool';
import { EnvMix, type MixDraw } from '../lib/envs/mix';
import { InferenceClient } from '../lib/orchestrator/client';
import { rlClientOptions } from '../lib/orchestrator/client-options';
import * as groups from '../lib/orchestrator/groups';
import { LOAD_INTERVAL_MS } from '../lib/orchestrator/adaptive';
import { ConcurrencyController } from '../lib/orchestrator/concurrency';
import { claimMetrics, capGroups, claimStep, type ClaimMix, resumeDraw } from '../lib/orchestrator/inflight-decisions';
import {
  groupNumbers,
  newestVersion,
  publishGroup,
  readConsumed,
  readGroup,
  writeConsumed,
  type ServerLoad,
  type StoredGroup,
} from '../lib/runfolder/inflight-groups';
import { RunLayout } from '../lib/runfolder/layout';
import { storedSummary, writeStepRollouts, type RolloutSummary, type StoredRollout } from '../lib/runfolder/rollouts';
import { withHeartbeat } from '../lib/temporal/heartbeat';

/** How often the producer and a waiting claim look at the run folder. */
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
      const layout = new RunLayout(runDir);
      const ctx = await groups.rolloutContext(runDir, pool);
      const { config, examplesPerStep } = ctx;
      const o = config.orchestrator;
      const cap = capGroups(o);
      fs.mkdirSync(layout.inflightGroupsDir, { recursive: true });
      const mix = new EnvMix(ctx.mixEntries, { seed: config.seed, examplesPerStep });
      // Two clients: `control` moves the servers to each new policy; `client` generates and is
      // never pinned to a policy (ensurePolicy), since in this mode an answer legitimately comes
      // from an older version than the newest (its request started before the update landed).
      const control = new InferenceClient(o.base_urls, rlClientOptions(config));
      const client = new InferenceClient(o.base_urls, rlClientOptions(config));
      const cancelled = Context.current().cancellationSignal;
      const known = groupNumbers(layout);
      let nextSeq = known.length > 0 ? known[known.length - 1] + 1 : 0;
      // A restarted producer plays new examples: draws continue after the highest stored one.
      let nextDraw = resumeDraw(known, cap, (seq) => readGroup(layout, seq)?.draw);
      // Rollouts in flight, within orchestrator.concurrency, following the servers' KV cache.
      const concurrency = new ConcurrencyController(o.concurrency, o.seq_len);
      const rpe = o.rollouts_per_example;
      let load: ServerLoad | undefined;
      let readingLoad = false;
      let nextReading = 0;
      let running = 0; // groups in flight
      let rolloutsInFlight = 0;
      let version = -1;
      let written = 0;
      let idleMs = 0;
      let idleSince: number | undefined = Date.now();
      let failure: unknown;
      /** Groups finished and not yet taken by a step (left over by one included). */
      const waiting = () => {
        const c = readConsumed(layout);
        return nextSeq - c.next + c.deferred;
      };

      /** Stores a finished group under the next free number. */
      const publish = (group: Omit<StoredGroup, 'seq'>) => {
        nextSeq = publishGroup(layout, group, nextSeq) + 1;
        written++;
      };

      const start = async (draw: number, startVersion: number) => {
        const seedStep = Math.floor(draw / examplesPerStep);
        const slot = draw % examplesPerStep;
        const d: MixDraw = mix.sample(seedStep)[slot];
        const [example] = await groups.examplesOf(ctx, pool, [d]);
        const rollouts = await groups.playGroup(
          ctx,
          pool,
          client,
          { draw: d, example, seedStep, group: slot, round: 0, policyVersion: startVersion },
          () => concurrency.finished(--rolloutsInFlight),
        );
        if (cancelled.aborted) return;
        const idleSeconds = idleMs / 1000;
        idleMs = 0;
        publish({
          draw,
          rollouts,
          startVersion,
          idleSeconds,
          // The limit in effect: the controller's, within the cap on groups generated ahead.
          concurrency: Math.min(concurrency.limit, cap * rpe),
          ...(load ? { load } : {}),
          finishedAt: Date.now() / 1000,
        });
      };

      /** Reads the servers' load beside the loop (a slow server's /metrics never holds up generation). */
      const readLoad = () => {
        readingLoad = true;
        void control
          .readings()
          .then((r) => {
            load = r?.reduce((a, l) => ({ running: a.running + l.running, waiting: a.waiting + l.waiting }), {
              running: 0,
              waiting: 0,
            });
            concurrency.observe(r, rolloutsInFlight);
          })
          .finally(() => {
            readingLoad = false;
            nextReading = Date.now() + LOAD_INTERVAL_MS;
          });
      };

      await withHeartbeat(
        () => ({
          phase: 'producing',
          running,
          rollouts: rolloutsInFlight,
          limit: concurrency.limit,
          load,
          version,
          written,
          next: nextSeq,
        }),
        async () => {
          while (!cancelled.aborted && failure === undefined) {
            const newest = newestVersion(layout);
            if (newest !== version) {
              await control.ensurePolicy({ version: newest, weightDir: layout.weightsDir(newest) });
              version = newest;
            }
            if (!readingLoad && Date.now() >= nextReading) readLoad();
            // A group's rollouts start together: one more group while it fits the limit (one at least).
            if ((running === 0 || rolloutsInFlight + rpe <= concurrency.limit) && waiting() + running < cap) {
              if (idleSince !== undefined) idleMs += Date.now() - idleSince;
              idleSince = undefined;
              running++;
              rolloutsInFlight += rpe;
              void start(nextDraw++, version)
                .catch((e) => (failure ??= e))
                .finally(() => {
                  if (--running === 0) idleSince = Date.now();
                });
              continue;
            }
            await sleep(POLL_MS);
          }
        },
      ).catch((e) => {
        failure ??= e;
      });
      if (failure !== undefined && !cancelled.aborted) throw groups.rolloutFailure(failure);
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
