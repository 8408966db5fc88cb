/**
 * The env worker pool: environment code (dataset generation, responses, scoring) runs in forked
 * child processes (lib/helper-pool.ts), so an env that throws, hangs or crashes costs one call,
 * never the orchestrator.
 *
 * - Each worker runs one call at a time; calls queue until a worker is free.
 * - A call that throws returns `{ok: false, kind: 'error'}`; the worker lives on.
 * - A call still running after `timeoutS` (counted from dispatch, not queueing) returns
 *   `kind: 'timeout'`; its worker is killed and replaced.
 * - A worker that exits mid-call returns `kind: 'crash'` for that call and is replaced.
 * Callers keep errored rollouts out of training and count them (`stats`).
 *
 * Workers are forked with register-ts.js preloaded, which lets them run from the TypeScript
 * sources (under jest) and load `.ts` user environments from the compiled build alike.
 */
import * as path from 'node:path';
import { HelperPool, exitText, type HelperOutcome } from '../helper-pool';
import { projectRoot } from '../paths';
import type { EnvSpec } from './loader';
import { VerifiersServers } from './verifiers/server';
import type { EnvCall, EnvTask } from './pool-protocol';
import type {
  EnvFailureKind,
  EnvResponse,
  EnvironmentInfo,
  Example,
  JsonObject,
  Score,
  ScoreContext,
  Split,
  TurnContext,
} from './types';

export interface EnvPoolOptions {
  /** Worker processes (config `env_workers`). */
  workers: number;
  /** Seconds one call may run (config `env_timeout_s`). */
  timeoutS: number;
}

export type EnvCallResult<T> =
  { ok: true; value: T } | { ok: false; kind: EnvFailureKind; error: string; stack?: string };

export interface EnvPoolStats {
  calls: number;
  errors: number;
  timeouts: number;
  crashes: number;
  /** Workers started to replace killed or crashed ones. */
  restarts: number;
}

// Same basename next to this file: pool-worker.ts under jest, pool-worker.js in dist/.
const WORKER_SCRIPT = path.join(__dirname, `pool-worker${path.extname(__filename)}`);
const REGISTER_TS = path.join(projectRoot, 'lib', 'envs', 'register-ts.js');

export class EnvPool {
  private readonly workers: HelperPool<EnvTask, unknown>;
  private readonly timeoutS: number;
  private readonly counters = { calls: 0, errors: 0, timeouts: 0, crashes: 0 };
  /** The env servers of `verifiers:` envs, which play their rollouts (closed with the pool). */
  readonly verifiers = new VerifiersServers();

  constructor(opts: EnvPoolOptions) {
    if (!Number.isInteger(opts.workers) || opts.workers < 1)
      throw new Error(`env pool: workers must be a positive integer, got ${opts.workers}`);
    if (!(opts.timeoutS > 0)) throw new Error(`env pool: timeoutS must be positive, got ${opts.timeoutS}`);
    this.timeoutS = opts.timeoutS;
    this.workers = new HelperPool({
      names: { pool: 'env pool', helper: 'env worker' },
      module: WORKER_SCRIPT,
      execArgv: ['--require', REGISTER_TS],
      processes: opts.workers,
      timeoutMs: opts.timeoutS * 1000,
      start: 'warm',
      output: 'inherit',
    });
  }

  get stats(): EnvPoolStats {
    return { ...this.counters, restarts: this.workers.stats.restarts };
  }

  /** Max turns, tool schemas and split sizes; also a cheap way to check that an env loads. */
  info(env: EnvSpec): Promise<EnvCallResult<EnvironmentInfo>> {
    return this.call(env, { op: 'info' });
  }

  example(env: EnvSpec, split: Split, index: number, seed: number): Promise<EnvCallResult<Example>> {
    return this.call(env, { op: 'example', split, index, seed });
  }

  init(env: EnvSpec, example: Example): Promise<EnvCallResult<JsonObject>> {
    return this.call(env, { op: 'init', example });
  }

  respond(env: EnvSpec, ctx: TurnContext): Promise<EnvCallResult<EnvResponse>> {
    return this.call(env, { op: 'respond', ctx });
  }

  score(env: EnvSpec, ctx: ScoreContext): Promise<EnvCallResult<Score>> {
    return this.call(env, { op: 'score', ctx });
  }

  /** Kills the workers; calls still queued or running reject. */
  async close(): Promise<void> {
    await this.verifiers.close();
    await this.workers.close();
  }

  private async call<T>(env: EnvSpec, call: EnvCall): Promise<EnvCallResult<T>> {
    const refused = this.workers.refusal;
    if (refused) throw refused;
    this.counters.calls++;
    return this.result(`environment "${env.id}" ${call.op}`, await this.workers.run({ env, call })) as EnvCallResult<T>;
  }

  /** A call's outcome, counted, its failure named after the call. */
  private result(name: string, o: HelperOutcome<unknown>): EnvCallResult<unknown> {
    if (o.ok) return o;
    switch (o.kind) {
      case 'error':
        this.counters.errors++;
        return { ok: false, kind: 'error', error: `${name} failed: ${o.error}`, stack: o.stack };
      case 'timeout':
        this.counters.timeouts++;
        return { ok: false, kind: 'timeout', error: `${name} timed out after ${this.timeoutS}s` };
      case 'died':
        this.counters.crashes++;
        return { ok: false, kind: 'crash', error: `${name}: env worker died (${exitText(o.exit)})` };
    }
  }
}
