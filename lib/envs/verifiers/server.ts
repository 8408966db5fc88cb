/**
 * The verifiers env servers of one process, and the client side of their protocol (verifiers 0.4.0,
 * `verifiers/v1/serve/`): ZeroMQ, the server a ROUTER, we a DEALER; every payload msgpack. A request
 * is `[request_id, method, payload]` (`health`, `run`, `cancel`); the server answers with
 * `[request_id, "delta" | "reply", data]` frames: a run streams its traces as deltas, which
 * `EpisodeAssembly` puts together, and ends with a reply holding the episode head and per-trace sizes.
 *
 * One server per distinct env config, started on first use (scripts/verifiers/serve_env.py, which
 * exits when our side of its stdin closes). As with the env pool, a failure costs one rollout: a
 * rollout past its timeout is cancelled and errors, and a server that then misses a health check is
 * killed; a server that dies errors its rollouts in flight; the next rollout starts a new one.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { decode, encode } from '@msgpack/msgpack';
import { Dealer } from 'zeromq';
import { textOf } from '../../json';
import type { EnvFailureKind, JsonObject } from '../types';
import type { VerifiersLaunch } from './environment';

/** A failure of one rollout's run on an env server. */
export class VerifiersRunError extends Error {
  constructor(
    message: string,
    readonly kind: EnvFailureKind,
  ) {
    super(message);
  }
}

/** A trace as the deltas assemble it: a dumped verifiers `Trace` (fields as its msgpack dump has them). */
export type WireTrace = JsonObject & { id: string; nodes: JsonObject[] };
/** An assembled episode: the reply's head plus the traces in the server's order. */
export type WireEpisode = JsonObject & { traces: WireTrace[] };

const LIST_FIELDS = ['nodes', 'calls', 'errors', 'extra_usage', 'request_rewrites', 'response_rewrites'];

/** The client's picture of one served episode (verifiers' `serve.delta.EpisodeAssembly`). */
export class EpisodeAssembly {
  private readonly traces = new Map<string, WireTrace>();

  apply(delta: JsonObject): void {
    const id = String(delta.trace);
    if (delta.discard) {
      this.traces.delete(id);
      return;
    }
    let trace = this.traces.get(id);
    if (!trace) {
      trace = { ...(delta.open as JsonObject), ...Object.fromEntries(LIST_FIELDS.map((f) => [f, []])) } as WireTrace;
      this.traces.set(id, trace);
    }
    for (const [index, links] of Object.entries((delta.links as Record<string, unknown[]>) ?? {})) {
      ((trace.nodes[Number(index)].semantic_parents as unknown[]) ?? []).push(...links);
    }
    for (const field of LIST_FIELDS) {
      if (Array.isArray(delta[field])) (trace[field] as unknown[]).push(...(delta[field] as unknown[]));
    }
    Object.assign(trace, (delta.set as JsonObject) ?? {});
  }

  /** The episode record; a trace count that differs from the server's means a lost delta. */
  finish(head: JsonObject, summaries: { id: string; nodes: number; calls: number }[]): WireEpisode {
    const traces = summaries.map((s) => {
      const trace = this.traces.get(s.id);
      if (!trace) throw new VerifiersRunError(`served episode is missing trace ${s.id}`, 'error');
      if (trace.nodes.length !== s.nodes || (trace.calls as unknown[]).length !== s.calls)
        throw new VerifiersRunError(
          `served trace ${s.id} assembled ${trace.nodes.length} nodes / ${(trace.calls as unknown[]).length} calls, the server reports ${s.nodes} / ${s.calls}`,
          'error',
        );
      return trace;
    });
    return { ...head, traces };
  }
}

interface Pending {
  resolve(data: JsonObject): void;
  reject(err: Error): void;
  onDelta?(delta: JsonObject): void;
}

/** One env server process and our DEALER socket to it. */
class EnvServerProcess {
  private readonly pending = new Map<string, Pending>();
  private readonly dealer = new Dealer({ linger: 0 });
  dead: Error | undefined;

  private constructor(
    private readonly child: ChildProcess,
    readonly address: string,
    private readonly stderrTail: () => string,
  ) {
    this.dealer.connect(address);
    void this.receive();
    child.once('exit', (code, signal) =>
      this.fail(new Error(`env server exited (${signal ?? `code ${code}`}): ${this.stderrTail()}`)),
    );
  }

  static start(
    name: string,
    launch: VerifiersLaunch,
    maxConcurrent: number | undefined,
    timeoutMs: number,
  ): Promise<EnvServerProcess> {
    const args = [launch.launcher, 'serve', '--config', JSON.stringify(launch.config)];
    if (maxConcurrent) args.push('--max-concurrent', String(maxConcurrent));
    const child = spawn(launch.python, args, { env: launch.env, stdio: ['pipe', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr!.on('data', (b: Buffer) => {
      stderr = (stderr + b.toString()).slice(-4000);
    });
    const tail = () => stderr.trim().split('\n').slice(-6).join('\n');
    return new Promise((resolve, reject) => {
      let out = '';
      const timer = setTimeout(() => {
        child.kill('SIGKILL');
        reject(new Error(`env server for ${name} did not report its address in ${timeoutMs / 1000}s: ${tail()}`));
      }, timeoutMs);
      const onExit = (code: number | null) => {
        clearTimeout(timer);
        reject(new Error(`env server for ${name} exited (code ${code}) before it was up: ${tail()}`));
      };
      child.once('exit', onExit);
      child.once('error', (e) => {
        clearTimeout(timer);
        reject(new Error(`env server for ${name}: cannot start ${launch.python}: ${e.message}`));
      });
      child.stdout!.on('data', (b: Buffer) => {
        out += b.toString();
        const line = out.split('\n').find((l) => l.startsWith('{"address"'));
        if (!line) return;
        clearTimeout(timer);
        child.off('exit', onExit);
        child.stdout!.removeAllListeners('data');
        child.stdout!.resume();
        resolve(new EnvServerProcess(child, (JSON.parse(line) as { address: string }).address, tail));
      });
    });
  }

  private async receive(): Promise<void> {
    try {
      for await (const frames of this.dealer) {
        if (frames.length !== 3) continue;
        const [rid, kind, data] = frames;
        const p = this.pending.get(rid.toString());
        if (!p) continue;
        let value: JsonObject;
        try {
          value = decode(data) as JsonObject;
        } catch (e) {
          this.pending.delete(rid.toString());
          p.reject(new VerifiersRunError(`undecodable frame from the env server: ${(e as Error).message}`, 'error'));
          continue;
        }
        if (kind.toString() === 'delta') {
          try {
            p.onDelta?.(value);
          } catch (e) {
            this.pending.delete(rid.toString());
            p.reject(new VerifiersRunError(`bad delta from the env server: ${(e as Error).message}`, 'error'));
          }
        } else {
          this.pending.delete(rid.toString());
          p.resolve(value);
        }
      }
    } catch (e) {
      if (!this.dead) this.fail(e as Error);
    }
  }

  private fail(err: Error): void {
    if (this.dead) return;
    this.dead = err;
    for (const p of this.pending.values()) p.reject(new VerifiersRunError(err.message, 'crash'));
    this.pending.clear();
    this.close();
  }

  /** Sends one request; resolves with its reply (rejects when the server dies, or after `timeoutMs`, cancelling a run). */
  request(
    method: string,
    payload: JsonObject,
    timeoutMs: number,
    onDelta?: (d: JsonObject) => void,
  ): Promise<JsonObject> {
    if (this.dead) return Promise.reject(new VerifiersRunError(this.dead.message, 'crash'));
    const rid = randomUUID().replace(/-/g, '');
    return new Promise<JsonObject>((resolve, reject) => {
      const timer = setTimeout(() => {
        if (!this.pending.delete(rid)) return;
        if (method === 'run') void this.send('cancel', { request_id: rid }).catch(() => undefined);
        reject(new VerifiersRunError(`${method} timed out after ${timeoutMs / 1000}s`, 'timeout'));
      }, timeoutMs);
      this.pending.set(rid, {
        resolve: (v) => (clearTimeout(timer), resolve(v)),
        reject: (e) => (clearTimeout(timer), reject(e)),
        onDelta,
      });
      this.send(method, payload, rid).catch((e: Error) => {
        this.pending.delete(rid);
        clearTimeout(timer);
        reject(new VerifiersRunError(`sending ${method}: ${e.message}`, 'crash'));
      });
    });
  }

  private send(method: string, payload: JsonObject, rid = randomUUID().replace(/-/g, '')): Promise<void> {
    return this.dealer.send([rid, method, encode(payload)]);
  }

  async healthy(timeoutMs: number): Promise<boolean> {
    try {
      return (await this.request('health', {}, timeoutMs)).success === true;
    } catch {
      return false;
    }
  }

  close(): void {
    this.dead ??= new Error('env server closed');
    this.dealer.close();
    this.child.stdin?.end();
    if (this.child.exitCode === null) this.child.kill('SIGKILL');
  }
}

/** What one run needs: the env server's launch, the task, and the model client for the env server. */
export interface VerifiersRun {
  /** Names the server (its launch and max_concurrent): one server per distinct key. */
  key: string;
  name: string;
  launch: VerifiersLaunch;
  maxConcurrent?: number;
  startTimeoutMs: number;
  timeoutMs: number;
  /** verifiers RunRequest fields. */
  task_data: JsonObject;
  client: JsonObject;
  model: string;
  sampling: JsonObject;
}

export interface VerifiersServerStats {
  started: number;
  restarts: number;
  killedHung: number;
}

export class VerifiersServers {
  private readonly servers = new Map<string, Promise<EnvServerProcess>>();
  readonly stats: VerifiersServerStats = { started: 0, restarts: 0, killedHung: 0 };
  private closed = false;

  private server(run: VerifiersRun): Promise<EnvServerProcess> {
    const current = this.servers.get(run.key);
    if (current) {
      return current.then(
        (s) => (s.dead ? this.restart(run) : s),
        () => this.restart(run),
      );
    }
    return this.restart(run, false);
  }

  private restart(run: VerifiersRun, again = true): Promise<EnvServerProcess> {
    if (this.closed) return Promise.reject(new Error('verifiers env servers closed'));
    const existing = this.servers.get(run.key);
    // Concurrent callers that saw the same dead server share one restart.
    const starting = (async () => {
      const old = await existing?.catch(() => undefined);
      if (old && !old.dead) return old;
      if (again) this.stats.restarts++;
      this.stats.started++;
      const s = await EnvServerProcess.start(run.name, run.launch, run.maxConcurrent, run.startTimeoutMs);
      const deadline = Date.now() + run.startTimeoutMs;
      while (!(await s.healthy(2000))) {
        if (s.dead || Date.now() > deadline) {
          s.close();
          throw new Error(
            `env server for ${run.name} did not answer health in ${run.startTimeoutMs / 1000}s: ${s.dead?.message ?? ''}`,
          );
        }
        await new Promise((r) => setTimeout(r, 250));
      }
      return s;
    })();
    this.servers.set(run.key, starting);
    return starting;
  }

  /** Plays one task on its env server: the assembled episode, or a VerifiersRunError for this run only. */
  async run(run: VerifiersRun): Promise<WireEpisode> {
    let server: EnvServerProcess;
    try {
      server = await this.server(run);
    } catch (e) {
      throw new VerifiersRunError((e as Error).message, 'crash');
    }
    const assembly = new EpisodeAssembly();
    try {
      const reply = await server.request(
        'run',
        { task_data: run.task_data, client: run.client, model: run.model, sampling: run.sampling },
        run.timeoutMs,
        (d) => assembly.apply(d),
      );
      if (reply.success !== true)
        throw new VerifiersRunError(`env server: ${textOf(reply.error ?? 'run failed')}`, 'error');
      return assembly.finish(reply.head as JsonObject, reply.traces as { id: string; nodes: number; calls: number }[]);
    } catch (e) {
      // A server that cannot answer health after a timed-out run is hung: kill it, the next run restarts it.
      if (e instanceof VerifiersRunError && e.kind === 'timeout' && !(await server.healthy(5000))) {
        this.stats.killedHung++;
        server.close();
      }
      throw e;
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    const all = [...this.servers.values()];
    this.servers.clear();
    for (const s of all) (await s.catch(() => undefined))?.close();
  }
}
