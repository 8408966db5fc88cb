/**
 * How many rollouts are in flight at once (`[orchestrator.concurrency]`, an eval's
 * `[concurrency]`): a limit that follows the inference servers' own counters on `/metrics`
 * (lib/orchestrator/server-load.ts), within [min_inflight, max_inflight]. Free of I/O: the caller
 * reads the servers (`observe`, every LOAD_INTERVAL_MS) and reports finished rollouts
 * (`finished`); it starts rollouts while fewer than `limit` are in flight.
 *
 *  - Start: initial_inflight, else, at the first reading that gives the servers' KV cache, as many
 *    rollouts as that cache holds sequences of the servers' context length (a pessimistic start:
 *    few rollouts fill their context); min_inflight until then.
 *  - Grow while the servers are clear: no preemption since the last reading, KV usage below
 *    GROW_BELOW in each of the last KV_WINDOW readings (usage swings as multi-turn rollouts leave
 *    between turns and come back longer: its peaks are what preempts), and no queue that grew
 *    (queued in the reading before and more queued in this one). A queue that holds or shrinks
 *    is not pressure: a multi-turn rollout's next turn waits for the engine's next step (such a
 *    queue comes and goes between readings), and a server's own sequence limit (max_running,
 *    vLLM's max_num_seqs) queues what it cannot run while its KV cache has room, where more in
 *    flight costs nothing; a queue that grows says the limit is past what the servers run. Then
 *    every finished rollout multiplies the limit by GROWTH^(1 / in flight): x GROWTH per
 *    turnover of the rollouts in flight, paced by the work itself whatever its scale, and only
 *    while the limit binds (at least BINDING x limit in flight: a limit nobody reaches tells
 *    nothing about more).
 *  - Cut when the servers are overloaded: a preemption (a sequence lost its KV blocks and will be
 *    recomputed: the cache is over-committed), or requests queued beyond QUEUE_RATIO x running for
 *    QUEUE_READINGS readings in a row (a long multi-turn episode never preempts: its next turn
 *    waits in the queue). The limit becomes CUT x the rollouts in flight (ESCALATED_CUT when it
 *    happens again right after a cut drained), and no further cut comes until the rollouts in
 *    flight have drained below the new limit with the servers settled: what the servers report
 *    meanwhile is the old load.
 *  - Trim ahead of overload: KV usage above TRIM_ABOVE sets the limit to in flight x TRIM_TO /
 *    usage (no more than one trim per TRIM_COOLDOWN readings, so each is seen before the next).
 *
 * Rollouts in flight are never cancelled: a lower limit holds new ones back until enough finish.
 * Without any load signal (an external API, a server without these gauges) the limit stays where
 * it started.
 */

/** One server's counters on one reading of its `/metrics`. */
export interface EngineReading {
  /** The server (its base URL): preemptions are counted per server. */
  id: string;
  running: number;
  waiting: number;
  /** Fraction of its KV cache blocks in use. */
  kvUsage?: number;
  /** Sequences preempted since it started (a counter). */
  preemptions?: number;
  /** Its KV cache in token positions. */
  capacityTokens?: number;
  /** The longest sequence it holds (its context length). */
  contextTokens?: number;
}

export const GROWTH = 1.25;
export const KV_WINDOW = 6;
export const BINDING = 0.9;
export const GROW_BELOW = 0.6;
export const TRIM_ABOVE = 0.8;
export const TRIM_TO = 0.7;
export const TRIM_COOLDOWN = 6;
export const QUEUE_RATIO = 0.5;
export const QUEUE_READINGS = 6;
export const CUT = 0.8;
export const QUEUE_CUT = 0.9;
export const ESCALATED_CUT = 0.5;
/** Readings after a drain during which another overload cuts harder. */
export const ESCALATION_READINGS = 6;

export interface ConcurrencyBounds {
  initial_inflight?: number;
  min_inflight: number;
  max_inflight: number;
}

/** Why the limit last moved (a metric and the log line). */
export type LimitChange = 'start' | 'grow' | 'preemption' | 'queue' | 'kv' | 'none';

export class ConcurrencyController {
  /** The limit as a real number (growth compounds in fractions); `limit` is its floor. */
  private cap: number;
  /** The servers' state at the last reading: clear (may grow), busy, or overloaded. */
  signal: 'clear' | 'busy' | 'overloaded' = 'busy';
  /** The last reading found nothing to read (no server reports its load). */
  private blind = true;
  private started: boolean;
  private readonly preemptions = new Map<string, number>();
  private readonly queued = new Map<string, number>();
  private queueReadings = 0;
  private cooldown = 0;
  private draining = false;
  private escalated = false;
  private grace = 0;
  /** KV usage at the last KV_WINDOW readings. */
  private kvRecent: number[] = [];
  /** Cuts and trims so far, by reason; preemptions seen. */
  readonly counts = { preemption: 0, queue: 0, kv: 0, preempted: 0 };
  last: LimitChange = 'none';

  constructor(
    private readonly bounds: ConcurrencyBounds,
    /** The context length the rollouts may reach: the start's unit when the servers report none. */
    private readonly seqLen: number,
  ) {
    if (bounds.min_inflight > bounds.max_inflight)
      throw new Error(`concurrency: min_inflight ${bounds.min_inflight} > max_inflight ${bounds.max_inflight}`);
    this.started = bounds.initial_inflight !== undefined;
    this.cap = this.clamp(bounds.initial_inflight ?? bounds.min_inflight);
  }

  /** Rollouts that may be in flight now. */
  get limit(): number {
    return Math.floor(this.cap);
  }

  private clamp(n: number): number {
    return Math.min(this.bounds.max_inflight, Math.max(this.bounds.min_inflight, n));
  }

  /** Lowers the limit (never raises it) to `to`; for the metrics, `why`. */
  private lower(to: number, why: LimitChange): void {
    const next = Math.min(this.cap, this.clamp(Math.floor(to)));
    if (Math.floor(next) < this.limit) this.last = why;
    this.cap = next;
  }

  /**
   * A reading of the servers (undefined, or a server missing: no signal this time), with
   * `inFlight` rollouts in flight.
   */
  observe(readings: readonly EngineReading[] | undefined, inFlight: number): void {
    if (!readings || readings.length === 0) {
      this.blind = true;
      this.signal = 'busy';
      return;
    }
    this.blind = false;
    if (!this.started) {
      const capacity = readings.reduce((a, r) => a + (r.capacityTokens ?? 0), 0);
      if (capacity > 0) {
        const context = Math.max(...readings.map((r) => r.contextTokens ?? this.seqLen));
        this.cap = this.clamp(Math.floor(capacity / Math.max(1, context)));
        this.started = true;
        this.last = 'start';
      }
    }
    let preempted = false;
    let queueGrew = false;
    let kv = 0;
    let running = 0;
    let waiting = 0;
    for (const r of readings) {
      const before = this.preemptions.get(r.id);
      if (r.preemptions !== undefined) {
        if (before !== undefined && r.preemptions > before) {
          preempted = true;
          this.counts.preempted += r.preemptions - before;
        }
        this.preemptions.set(r.id, r.preemptions);
      }
      const queuedBefore = this.queued.get(r.id) ?? 0;
      if (queuedBefore > 0 && r.waiting > queuedBefore) queueGrew = true;
      this.queued.set(r.id, r.waiting);
      kv = Math.max(kv, r.kvUsage ?? 0);
      running += r.running;
      waiting += r.waiting;
    }
    this.queueReadings = running > 0 && waiting > QUEUE_RATIO * running ? this.queueReadings + 1 : 0;
    const queueOverload = this.queueReadings >= QUEUE_READINGS;
    this.kvRecent = [...this.kvRecent.slice(1 - KV_WINDOW), kv];
    const usage = Math.max(...this.kvRecent);
    this.signal = preempted || queueOverload ? 'overloaded' : queueGrew || usage >= GROW_BELOW ? 'busy' : 'clear';
    // A cut's drain ends once the rollouts are within the new limit and the servers have settled.
    if (this.draining && inFlight <= this.limit && !preempted && !queueOverload) {
      this.draining = false;
      this.grace = ESCALATION_READINGS;
    } else if (!this.draining && this.escalated && --this.grace <= 0) this.escalated = false;
    this.cooldown = Math.max(0, this.cooldown - 1);
    if (this.draining) return;
    if (preempted || queueOverload) {
      if (queueOverload) this.queueReadings = 0;
      const fraction = this.escalated ? ESCALATED_CUT : queueOverload ? QUEUE_CUT : CUT;
      const why = preempted ? 'preemption' : 'queue';
      this.counts[why]++;
      this.lower(inFlight * fraction, why);
      this.draining = true;
      this.escalated = true;
      return;
    }
    if (kv > TRIM_ABOVE && inFlight > 0 && this.cooldown === 0) {
      this.counts.kv++;
      this.lower((inFlight * TRIM_TO) / kv, 'kv');
      this.cooldown = TRIM_COOLDOWN;
    }
  }

  /** A rollout finished (`inFlight`: those still in flight, without it). */
  finished(inFlight: number): void {
    if (this.blind || this.signal !== 'clear' || this.draining) return;
    const pool = inFlight + 1;
    if (pool < BINDING * this.limit) return;
    const before = this.limit;
    this.cap = this.clamp(this.cap * GROWTH ** (1 / pool));
    if (this.limit > before) this.last = 'grow';
  }
}

/**
 * The fixed limit when there is no load signal to follow (an external API): initial_inflight,
 * else 64 within the bounds.
 */
export function fixedLimit(bounds: ConcurrencyBounds): number {
  return Math.min(bounds.max_inflight, Math.max(bounds.min_inflight, bounds.initial_inflight ?? 64));
}
