/**
 * In-flight mode's producer (activities/inflight-rollouts.ts runs it as `produceRollouts`): generates groups
 * continuously until cancelled. Before starting each group it makes the servers serve the newest
 * policy in `weights/`; each finished group is published under the next free number
 * (lib/runfolder/inflight-groups.ts `publishGroup`). It keeps at most `capGroups` groups generated ahead
 * of the steps (waiting or running), and rollouts in flight within the run's
 * ConcurrencyController, which follows the servers' load, read beside the loop.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import * as fs from 'node:fs';
import type { EnvPool } from '../envs/pool';
import { EnvMix, type MixDraw } from '../envs/mix';
import {
  groupNumbers,
  newestVersion,
  publishGroup,
  readConsumed,
  readGroup,
  type ServerLoad,
  type StoredGroup,
} from '../runfolder/inflight-groups';
import { RunLayout } from '../runfolder/layout';
import { LOAD_INTERVAL_MS } from './adaptive';
import { InferenceClient } from './client';
import { rlClientOptions } from './client-options';
import { ConcurrencyController } from './concurrency';
import * as groups from './groups';
import { capGroups, resumeDraw } from './inflight-decisions';

/** How often the producer looks again when it may start no group. */
const POLL_MS = 100;

/** What the producer is doing, for its activity's heartbeats. */
export interface ProducerStatus {
  phase: 'producing';
  /** Groups in flight. */
  running: number;
  rollouts: number;
  limit: number;
  load?: ServerLoad;
  version: number;
  written: number;
  next: number;
}

export class Producer {
  private readonly layout: RunLayout;
  private readonly cap: number;
  private readonly mix: EnvMix;
  /** Moves the servers to each new policy. */
  private readonly control: InferenceClient;
  /**
   * Generates; never pinned to a policy (ensurePolicy), since in this mode an answer legitimately
   * comes from an older version than the newest (its request started before the update landed).
   */
  private readonly client: InferenceClient;
  /** Rollouts in flight, within orchestrator.concurrency, following the servers' KV cache. */
  private readonly concurrency: ConcurrencyController;
  private nextSeq: number;
  private nextDraw: number;
  private load: ServerLoad | undefined;
  private readingLoad = false;
  private nextReading = 0;
  /** Groups in flight. */
  private running = 0;
  private rolloutsInFlight = 0;
  private version = -1;
  private written = 0;
  private idleMs = 0;
  private idleSince: number | undefined = Date.now();
  private failure: unknown;

  /** A producer of the run `ctx` describes, in `runDir`; stops once `cancelled` aborts. */
  constructor(
    runDir: string,
    private readonly ctx: groups.RolloutContext,
    private readonly pool: EnvPool,
    private readonly cancelled: AbortSignal,
  ) {
    const { config, examplesPerStep } = ctx;
    const o = config.orchestrator;
    this.layout = new RunLayout(runDir);
    this.cap = capGroups(o);
    fs.mkdirSync(this.layout.inflightGroupsDir, { recursive: true });
    this.mix = new EnvMix(ctx.mixEntries, { seed: config.seed, examplesPerStep });
    this.control = new InferenceClient(o.base_urls, rlClientOptions(config));
    this.client = new InferenceClient(o.base_urls, rlClientOptions(config));
    const known = groupNumbers(this.layout);
    this.nextSeq = known.length > 0 ? known[known.length - 1] + 1 : 0;
    // A restarted producer plays new examples: draws continue after the highest stored one.
    this.nextDraw = resumeDraw(known, this.cap, (seq) => readGroup(this.layout, seq)?.draw);
    this.concurrency = new ConcurrencyController(o.concurrency, o.seq_len);
  }

  status(): ProducerStatus {
    return {
      phase: 'producing',
      running: this.running,
      rollouts: this.rolloutsInFlight,
      limit: this.concurrency.limit,
      load: this.load,
      version: this.version,
      written: this.written,
      next: this.nextSeq,
    };
  }

  /** Generates until cancelled; rejects with the first failure of a group or of the loop, unless cancelled meanwhile. */
  async run(): Promise<void> {
    const rpe = this.ctx.config.orchestrator.rollouts_per_example;
    try {
      while (!this.cancelled.aborted && this.failure === undefined) {
        const newest = newestVersion(this.layout);
        if (newest !== this.version) {
          await this.control.ensurePolicy({ version: newest, weightDir: this.layout.weightsDir(newest) });
          this.version = newest;
        }
        if (!this.readingLoad && Date.now() >= this.nextReading) this.readLoad();
        // A group's rollouts start together: one more group while it fits the limit (one at least).
        if (
          (this.running === 0 || this.rolloutsInFlight + rpe <= this.concurrency.limit) &&
          this.waiting() + this.running < this.cap
        ) {
          if (this.idleSince !== undefined) this.idleMs += Date.now() - this.idleSince;
          this.idleSince = undefined;
          this.running++;
          this.rolloutsInFlight += rpe;
          void this.play(this.nextDraw++, this.version)
            .catch((e) => (this.failure ??= e))
            .finally(() => {
              if (--this.running === 0) this.idleSince = Date.now();
            });
          continue;
        }
        await sleep(POLL_MS);
      }
    } catch (e) {
      this.failure ??= e;
    }
    if (this.failure !== undefined && !this.cancelled.aborted) throw this.failure;
  }

  /** Groups finished and not yet taken by a step (left over by one included). */
  private waiting(): number {
    const c = readConsumed(this.layout);
    return this.nextSeq - c.next + c.deferred;
  }

  /** Plays the group of draw `draw` on policy `startVersion` and publishes it under the next free number. */
  private async play(draw: number, startVersion: number): Promise<void> {
    const { ctx, pool, mix, concurrency } = this;
    const { examplesPerStep } = ctx;
    const seedStep = Math.floor(draw / examplesPerStep);
    const slot = draw % examplesPerStep;
    const d: MixDraw = mix.sample(seedStep)[slot];
    const [example] = await groups.examplesOf(ctx, pool, [d]);
    const rollouts = await groups.playGroup(
      ctx,
      pool,
      this.client,
      { draw: d, example, seedStep, group: slot, round: 0, policyVersion: startVersion },
      () => concurrency.finished(--this.rolloutsInFlight),
    );
    if (this.cancelled.aborted) return;
    const idleSeconds = this.idleMs / 1000;
    this.idleMs = 0;
    const group: Omit<StoredGroup, 'seq'> = {
      draw,
      rollouts,
      startVersion,
      idleSeconds,
      // The limit in effect: the controller's, within the cap on groups generated ahead.
      concurrency: Math.min(concurrency.limit, this.cap * ctx.config.orchestrator.rollouts_per_example),
      ...(this.load ? { load: this.load } : {}),
      finishedAt: Date.now() / 1000,
    };
    this.nextSeq = publishGroup(this.layout, group, this.nextSeq) + 1;
    this.written++;
  }

  /** Reads the servers' load beside the loop (a slow server's /metrics never holds up generation). */
  private readLoad(): void {
    this.readingLoad = true;
    void this.control
      .readings()
      .then((r) => {
        this.load = r?.reduce((a, l) => ({ running: a.running + l.running, waiting: a.waiting + l.waiting }), {
          running: 0,
          waiting: 0,
        });
        this.concurrency.observe(r, this.rolloutsInFlight);
      })
      .finally(() => {
        this.readingLoad = false;
        this.nextReading = Date.now() + LOAD_INTERVAL_MS;
      });
  }
}
