/**
 * The env worker pool: environment code (dataset generation, responses, scoring) runs in forked
 * child processes, so an env that throws, hangs or crashes costs one call, never the orchestrator.
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
import { fork, type ChildProcess } from 'node:child_process';
import * as path from 'node:path';
import { projectRoot } from '../paths';
import type { EnvSpec } from './loader';
import { VerifiersServers } from './verifiers/server';
import type { EnvCall, PoolRequest, WorkerMessage } from './pool-protocol';
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
/** Workers that die before they are ready, in a row, before the pool gives up (a broken install). */
const MAX_STARTUP_FAILURES = 3;

interface Pending {
  req: PoolRequest;
  resolve(result: EnvCallResult<unknown>): void;
  reject(err: Error): void;
}

interface Worker {
  child: ChildProcess;
  ready: boolean;
  /** Set once the pool stops caring about this process (killed, crashed, closed). */
  retired: boolean;
  current?: Pending;
  timer?: NodeJS.Timeout;
}

export class EnvPool {
  private readonly workers = new Set<Worker>();
  private readonly queue: Pending[] = [];
  private readonly timeoutMs: number;
  private nextId = 0;
  private startupFailures = 0;
  private closed = false;
  private broken: Error | undefined;
  private readonly counters: EnvPoolStats = { calls: 0, errors: 0, timeouts: 0, crashes: 0, restarts: 0 };
  /** The env servers of `verifiers:` envs, which play their rollouts (closed with the pool). */
  readonly verifiers = new VerifiersServers();

  constructor(opts: EnvPoolOptions) {
    if (!Number.isInteger(opts.workers) || opts.workers < 1)
      throw new Error(`env pool: workers must be a positive integer, got ${opts.workers}`);
    if (!(opts.timeoutS > 0)) throw new Error(`env pool: timeoutS must be positive, got ${opts.timeoutS}`);
    this.timeoutMs = opts.timeoutS * 1000;
    for (let i = 0; i < opts.workers; i++) this.spawn();
  }

  get stats(): EnvPoolStats {
    return { ...this.counters };
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
    if (this.closed) return;
    this.closed = true;
    await this.verifiers.close();
    const closedError = new Error('env pool closed');
    for (const p of this.queue.splice(0)) p.reject(closedError);
    const exits: Promise<void>[] = [];
    for (const w of this.workers) {
      if (w.current) w.current.reject(closedError);
      exits.push(this.retire(w));
    }
    await Promise.all(exits);
  }

  private call<T>(env: EnvSpec, call: EnvCall): Promise<EnvCallResult<T>> {
    if (this.closed) return Promise.reject(new Error('env pool closed'));
    if (this.broken) return Promise.reject(this.broken);
    this.counters.calls++;
    return new Promise<EnvCallResult<T>>((resolve, reject) => {
      const req: PoolRequest = { id: this.nextId++, env, call };
      this.queue.push({ req, resolve: resolve as Pending['resolve'], reject });
      this.dispatch();
    });
  }

  private spawn(): void {
    const child = fork(WORKER_SCRIPT, [], {
      execArgv: ['--require', REGISTER_TS],
      // The environment this code sees (HF_HUB_CACHE, PYTHONPATH for verifiers env servers), also
      // where that is not the process's own (a jest test file's).
      env: process.env,
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const w: Worker = { child, ready: false, retired: false };
    this.workers.add(w);
    child.on('message', (m: WorkerMessage) => this.onMessage(w, m));
    child.on('exit', (code, signal) => this.onExit(w, signal ? `signal ${signal}` : `exit code ${code}`));
    // Spawn or IPC failure: the process is unusable either way.
    child.on('error', (err) => this.onExit(w, err.message));
  }

  private onMessage(w: Worker, m: WorkerMessage): void {
    if (w.retired) return;
    if (m.type === 'ready') {
      w.ready = true;
      this.startupFailures = 0;
      this.dispatch();
      return;
    }
    const p = w.current;
    if (!p || p.req.id !== m.id) return;
    this.settle(w);
    if (m.ok) {
      p.resolve({ ok: true, value: m.value });
    } else {
      this.counters.errors++;
      p.resolve({ ok: false, kind: 'error', error: `${callName(p.req)} failed: ${m.error}`, stack: m.stack });
    }
    this.dispatch();
  }

  private onExit(w: Worker, how: string): void {
    if (w.retired) return;
    void this.retire(w);
    const p = w.current;
    if (p) {
      this.counters.crashes++;
      p.resolve({ ok: false, kind: 'crash', error: `${callName(p.req)}: env worker died (${how})` });
    }
    if (!w.ready && ++this.startupFailures >= MAX_STARTUP_FAILURES) {
      this.broken = new Error(
        `env pool: ${MAX_STARTUP_FAILURES} env workers in a row died before starting (last: ${how})`,
      );
      for (const q of this.queue.splice(0)) q.reject(this.broken);
      return;
    }
    this.replace();
  }

  private onTimeout(w: Worker): void {
    const p = w.current;
    if (!p || w.retired) return;
    this.counters.timeouts++;
    void this.retire(w);
    p.resolve({ ok: false, kind: 'timeout', error: `${callName(p.req)} timed out after ${this.timeoutMs / 1000}s` });
    this.replace();
  }

  private replace(): void {
    if (this.closed) return;
    this.counters.restarts++;
    this.spawn();
  }

  private dispatch(): void {
    for (const w of this.workers) {
      if (this.queue.length === 0) return;
      if (!w.ready || w.retired || w.current) continue;
      const p = this.queue.shift()!;
      w.current = p;
      w.timer = setTimeout(() => this.onTimeout(w), this.timeoutMs);
      w.child.send(p.req, (err) => {
        if (err) this.onExit(w, `send failed: ${err.message}`);
      });
    }
  }

  /** Clears the call slot of a worker. */
  private settle(w: Worker): void {
    clearTimeout(w.timer);
    w.timer = undefined;
    w.current = undefined;
  }

  /** Stops using a worker (its `current` call stays for the caller to settle) and kills it. */
  private retire(w: Worker): Promise<void> {
    w.retired = true;
    clearTimeout(w.timer);
    this.workers.delete(w);
    const { child } = w;
    if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
    return new Promise((resolve) => {
      child.once('exit', () => resolve());
      child.kill('SIGKILL');
    });
  }
}

function callName(req: PoolRequest): string {
  return `environment "${req.env.id}" ${req.call.op}`;
}
