/**
 * A pool of forked helper processes for work that must not take its caller down: code that may
 * throw, hang, loop or exhaust its heap (environments, chat templates) runs in a helper, and what
 * it costs is one task, never the process that asked.
 *
 * - Each helper runs one task at a time; tasks queue until a helper is ready and free, so a task
 *   is never bound to a helper that dies before it starts: it goes to the next one.
 * - A task that throws ends `{kind: 'error'}`; its helper lives on.
 * - A task still running `timeoutMs` after it reached its helper ends `{kind: 'timeout'}`; its
 *   helper is killed and replaced.
 * - A helper that dies mid-task (a crash, its heap limit `heapMb`) ends that task alone
 *   `{kind: 'died'}`, with its exit and the end of its stderr where kept; it is replaced.
 * - Helpers that die before they are ready, `MAX_STARTUP_FAILURES` in a row, are a broken install:
 *   the pool refuses every task from then on, naming the last death.
 *
 * The helper's module calls `serveTasks` once it is ready. Messages cross the IPC channel as JSON
 * (Node's `json` serialization, parsed without recursion: nothing a task holds can overflow a
 * helper's stack as it is read).
 */
import { fork, type ChildProcess } from 'node:child_process';

export interface HelperPoolOptions {
  /** The pool and its helpers as errors name them: `{pool: 'env pool', helper: 'env worker'}`. */
  names: { pool: string; helper: string };
  /** The helper's entry module (it calls `serveTasks`), its arguments and Node options. */
  module: string;
  args?: string[];
  execArgv?: string[];
  /** Helpers at most (tasks at once). */
  processes: number;
  /** Longest a task may run in its helper. */
  timeoutMs: number;
  /** Heap of each helper (V8's old generation), in MiB; Node's default when unset. */
  heapMb?: number;
  /**
   * `warm`: every helper starts now, and a replacement as soon as one is gone (tasks never wait for
   * a start). `lazy`: a helper starts when a task finds none free.
   */
  start: 'warm' | 'lazy';
  /**
   * A helper's stdout and stderr: passed on to this process's (`inherit`), or stdout dropped and
   * the end of stderr kept for `died` outcomes (`tail`: how it died, never shown to whoever asked).
   */
  output: 'inherit' | 'tail';
}

/** How a helper ended: its exit, or why it could not be started or reached. */
export type HelperExit = { code: number | null; signal: NodeJS.Signals | null } | { failed: string };

/** What a task ends with. */
export type HelperOutcome<A> =
  | { ok: true; value: A }
  | { ok: false; kind: 'error'; error: string; stack?: string }
  | { ok: false; kind: 'timeout' }
  | { ok: false; kind: 'died'; exit: HelperExit; stderr: string };

/** Counters over the pool's life. */
export interface HelperPoolStats {
  /** Helpers started to replace killed or dead ones. */
  restarts: number;
}

/** `signal SIGSEGV`, `exit code 3`, or why it failed. */
export function exitText(exit: HelperExit): string {
  if ('failed' in exit) return exit.failed;
  return exit.signal ? `signal ${exit.signal}` : `exit code ${exit.code}`;
}

/** Helpers that die before they are ready, in a row, before the pool gives up (a broken install). */
const MAX_STARTUP_FAILURES = 3;
/** How much of a helper's stderr `output: 'tail'` keeps. */
const STDERR_TAIL = 4096;

type ToHelper<T> = { id: number; task: T };
type FromHelper<A> =
  { ready: true } | { id: number; ok: true; value: A } | { id: number; ok: false; error: string; stack?: string };

interface Pending<T, A> {
  id: number;
  task: T;
  resolve(outcome: HelperOutcome<A>): void;
  reject(err: Error): void;
}

interface Helper<T, A> {
  child: ChildProcess;
  ready: boolean;
  /** Set once the pool stops caring about this process (killed, dead, closed). */
  retired: boolean;
  current?: Pending<T, A>;
  timer?: NodeJS.Timeout;
  stderr: string;
}

export class HelperPool<T, A> {
  private readonly helpers = new Set<Helper<T, A>>();
  private readonly queue: Pending<T, A>[] = [];
  private nextId = 0;
  private startupFailures = 0;
  private closed = false;
  private broken: Error | undefined;
  private restarts = 0;

  constructor(private readonly options: HelperPoolOptions) {
    const { pool } = options.names;
    if (!Number.isInteger(options.processes) || options.processes < 1)
      throw new Error(`${pool}: processes must be a positive integer, got ${options.processes}`);
    if (!(options.timeoutMs > 0))
      throw new Error(`${pool}: the time limit must be positive, got ${options.timeoutMs} ms`);
    if (options.start === 'warm') for (let i = 0; i < options.processes; i++) this.spawn();
  }

  get stats(): HelperPoolStats {
    return { restarts: this.restarts };
  }

  /** Why the pool takes no task (closed, or broken), if it takes none. */
  get refusal(): Error | undefined {
    return this.closed ? new Error(`${this.options.names.pool} closed`) : this.broken;
  }

  /** Runs `task` in a helper; rejects only when the pool refuses it (`refusal`) or closes meanwhile. */
  run(task: T): Promise<HelperOutcome<A>> {
    const refused = this.refusal;
    if (refused) return Promise.reject(refused);
    return new Promise<HelperOutcome<A>>((resolve, reject) => {
      this.queue.push({ id: this.nextId++, task, resolve, reject });
      this.dispatch();
    });
  }

  /** Kills the helpers; tasks still queued or running reject. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const closed = this.refusal!;
    for (const p of this.queue.splice(0)) p.reject(closed);
    const exits: Promise<void>[] = [];
    for (const h of this.helpers) {
      h.current?.reject(closed);
      exits.push(this.retire(h));
    }
    await Promise.all(exits);
  }

  private spawn(): void {
    const { module, args = [], execArgv = [], heapMb, output } = this.options;
    const child = fork(module, args, {
      execArgv: heapMb === undefined ? execArgv : [...execArgv, `--max-old-space-size=${heapMb}`],
      // The environment this code sees (HF_HUB_CACHE, PYTHONPATH for verifiers env servers), also
      // where that is not the process's own (a jest test file's).
      env: process.env,
      serialization: 'json',
      stdio: output === 'tail' ? ['ignore', 'ignore', 'pipe', 'ipc'] : ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const h: Helper<T, A> = { child, ready: false, retired: false, stderr: '' };
    this.helpers.add(h);
    child.stderr?.on('data', (d: Buffer) => (h.stderr = (h.stderr + d.toString()).slice(-STDERR_TAIL)));
    child.on('message', (m: FromHelper<A>) => this.onMessage(h, m));
    child.on('exit', (code, signal) => {
      // Piped stderr may still hold unread data at 'exit'; 'close' comes once it is all read.
      if (child.stderr) child.once('close', () => this.onExit(h, { code, signal }));
      else this.onExit(h, { code, signal });
    });
    // Spawn or IPC failure: the process is unusable either way.
    child.on('error', (err) => this.onExit(h, { failed: err.message }));
  }

  private onMessage(h: Helper<T, A>, m: FromHelper<A>): void {
    if (h.retired) return;
    if ('ready' in m) {
      h.ready = true;
      this.startupFailures = 0;
      this.dispatch();
      return;
    }
    const p = h.current;
    if (!p || p.id !== m.id) return;
    clearTimeout(h.timer);
    h.timer = h.current = undefined;
    p.resolve(m.ok ? { ok: true, value: m.value } : { ok: false, kind: 'error', error: m.error, stack: m.stack });
    this.dispatch();
  }

  private onExit(h: Helper<T, A>, exit: HelperExit): void {
    if (h.retired) return;
    void this.retire(h);
    h.current?.resolve({ ok: false, kind: 'died', exit, stderr: h.stderr });
    if (!h.ready && ++this.startupFailures >= MAX_STARTUP_FAILURES) {
      const { pool, helper } = this.options.names;
      this.broken = new Error(
        `${pool}: ${MAX_STARTUP_FAILURES} ${helper}s in a row died before starting (last: ${exitText(exit)})`,
      );
      for (const q of this.queue.splice(0)) q.reject(this.broken);
      return;
    }
    this.replace();
  }

  private onTimeout(h: Helper<T, A>): void {
    const p = h.current;
    if (!p || h.retired) return;
    void this.retire(h);
    p.resolve({ ok: false, kind: 'timeout' });
    this.replace();
  }

  /** A helper is gone: a warm pool starts its replacement now, a lazy one when a task needs it. */
  private replace(): void {
    if (this.closed) return;
    this.restarts++;
    if (this.options.start === 'warm') this.spawn();
    this.dispatch();
  }

  /** Hands queued tasks to ready, idle helpers; a lazy pool starts helpers for the tasks left. */
  private dispatch(): void {
    for (const h of this.helpers) {
      if (this.queue.length === 0) return;
      if (!h.ready || h.retired || h.current) continue;
      const p = this.queue.shift()!;
      h.current = p;
      h.timer = setTimeout(() => this.onTimeout(h), this.options.timeoutMs);
      h.timer.unref();
      h.child.send({ id: p.id, task: p.task } satisfies ToHelper<T>, (err) => {
        if (err) this.onExit(h, { failed: `send failed: ${err.message}` });
      });
    }
    if (this.options.start === 'lazy' && !this.closed) {
      let starting = [...this.helpers].filter((h) => !h.ready).length;
      while (this.queue.length > starting && this.helpers.size < this.options.processes) {
        this.spawn();
        starting++;
      }
    }
  }

  /** Stops using a helper (its `current` task stays for the caller to settle) and kills it. */
  private retire(h: Helper<T, A>): Promise<void> {
    h.retired = true;
    clearTimeout(h.timer);
    this.helpers.delete(h);
    const { child } = h;
    if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
    return new Promise((resolve) => {
      child.once('exit', () => resolve());
      child.kill('SIGKILL');
    });
  }
}

/**
 * The helper's side: runs each task the pool sends with `run`, one at a time (the pool sends the
 * next only after the answer), and answers; a thrown error is the task's `error` outcome. Call it
 * once the helper is ready (its setup done: the pool counts a task's time from then). The helper
 * exits when its pool goes away (its IPC channel closes), never lingering as an orphan.
 */
export function serveTasks<T, A>(run: (task: T) => A | Promise<A>): void {
  const send = (m: FromHelper<A>) => process.send!(m);
  process.on('message', async ({ id, task }: ToHelper<T>) => {
    try {
      send({ id, ok: true, value: await run(task) });
    } catch (err) {
      const e = err instanceof Error ? err : new Error(String(err));
      send({ id, ok: false, error: e.message, stack: e.stack });
    }
  });
  process.on('disconnect', () => process.exit(0));
  send({ ready: true });
}
