/**
 * Process supervision for the launcher: processes kept alive (restarted when they die, and killed
 * to be restarted when they fall silent: `Liveness`), started as `prime-rl` child processes that
 * die with the launcher, and `<run>/launcher.json`, which lets the next launch of a run find what a
 * killed launcher left.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import type { Socket } from 'node:net';
import * as path from 'node:path';
import type { Readable } from 'node:stream';
import { writeFileAtomic } from '../atomic';
import { projectRoot } from '../paths';
import { formatMs, Watchdog, withDeadline } from '../deadline';
import {
  asProcessId,
  isRunning,
  PARENT_PIPE_ENV,
  parentPipeOptions,
  PIPE_BEAT_MS,
  PIPE_READY,
  processId,
  processState,
  terminateProcess,
  type ProcessId,
} from '../proc';
import type { RunLayout } from '../runfolder/layout';

/**
 * How a supervised process shows it is alive. A prime-rl child beats over its parent pipe
 * (lib/proc.ts); another process (the Temporal dev server) is probed. Silent for `deadlineMs` once
 * it is ready (it announced so, or a probe answered), it is hung (stopped, its event loop blocked,
 * stuck in a syscall): SIGKILLed, and so restarted. Before it is ready it may block while it
 * starts (loading a model): then only a stopped process (SIGSTOP) counts as silent.
 */
export interface Liveness {
  deadlineMs: number;
  /** Resolves when the process answers (`signal` aborts a probe that waits too long); none: pipe beats. */
  probe?: (signal: AbortSignal) => Promise<void>;
}

/** Each probe's own bound: a fraction of the deadline, so that several tries fit in it. */
const probeBound = (deadlineMs: number) => Math.min(5_000, deadlineMs / 3);

/**
 * A process kept alive: restarted (after a short pause) whenever it exits, or is killed for being
 * silent past its liveness deadline, until stopped. It is our child, or one that a killed launcher
 * left running (adopted: no exit event reaches us, so it is polled). `onStart` sees each process it
 * starts, to record it.
 */
export class Supervised {
  private child?: ChildProcess;
  private adopted?: { id: ProcessId; poll: NodeJS.Timeout };
  /** The pending restart after an exit (cleared by stop and release: no timer outlives supervision). */
  private restart?: NodeJS.Timeout;
  private watch?: { dog: Watchdog; poll: NodeJS.Timeout };
  private stopped = false;
  restarts = 0;

  constructor(
    readonly name: string,
    private readonly start: () => ChildProcess,
    private readonly log: (line: string) => void,
    private readonly onStart: (id: ProcessId) => void = () => undefined,
    adopt?: ProcessId,
    private readonly liveness?: Liveness,
  ) {
    if (adopt) this.adopt(adopt);
    else this.launch();
  }

  private exited(how: string): void {
    this.unwatch();
    if (this.stopped) return;
    this.restarts++;
    this.log(`${this.name} exited (${how}); restarting`);
    this.restart = setTimeout(() => !this.stopped && this.launch(), 1000);
  }

  private launch(): void {
    const child = this.start();
    this.child = child;
    const id = processId(child.pid);
    if (id) this.onStart(id);
    child.once('exit', (code, signal) => this.exited(`code ${code}, signal ${signal}`));
    // The parent pipe (stdio[3]) of a prime-rl child carries its beats.
    const pipe = child.stdio[3] as Readable | null | undefined;
    if (id) this.watchLiveness(id, pipe ?? undefined);
    else pipe?.resume();
  }

  private adopt(id: ProcessId): void {
    const poll = setInterval(() => {
      if (isRunning(id)) return;
      clearInterval(poll);
      this.adopted = undefined;
      this.exited(`pid ${id.pid} gone`);
    }, 500);
    this.adopted = { id, poll };
    this.watchLiveness(id);
  }

  /** Kills `id` once it is silent past the deadline (see `Liveness`); its exit restarts it. */
  private watchLiveness(id: ProcessId, pipe?: Readable): void {
    const liveness = this.liveness;
    if (!liveness) {
      pipe?.resume();
      return;
    }
    let ready = false;
    const dog = new Watchdog(liveness.deadlineMs, (silentMs) => {
      if (this.stopped || !isRunning(id)) return;
      this.log(
        `${this.name} (pid ${id.pid}) silent for ${formatMs(silentMs)} (state ${processState(id.pid) ?? '?'}: stopped, its event loop blocked, or stuck): killing it`,
      );
      try {
        process.kill(id.pid, 'SIGKILL');
      } catch {
        // gone meanwhile
      }
    });
    pipe?.on('data', (chunk: Buffer) => {
      if (chunk.includes(PIPE_READY)) ready = true;
      dog.beat();
    });
    pipe?.on('error', () => undefined);
    let probing = false;
    const poll = setInterval(() => {
      // Starting: only a stopped process is silent (start-up may block its event loop).
      if (!ready && processState(id.pid) !== 'T') dog.beat();
      if (!liveness.probe || probing) return;
      probing = true;
      withDeadline(`${this.name} liveness probe`, probeBound(liveness.deadlineMs), liveness.probe)
        .then(
          () => {
            ready = true;
            dog.beat();
          },
          () => undefined,
        )
        .finally(() => (probing = false));
    }, PIPE_BEAT_MS);
    this.watch = { dog, poll };
  }

  private unwatch(): void {
    this.watch?.dog.stop();
    clearInterval(this.watch?.poll);
    this.watch = undefined;
  }

  get pid(): number | undefined {
    return this.adopted?.id.pid ?? this.child?.pid;
  }

  /** Stops supervising and leaves the process running, no longer holding this process open. */
  release(): void {
    this.stopped = true;
    this.unwatch();
    clearTimeout(this.restart);
    clearInterval(this.adopted?.poll);
    this.child?.unref();
    // Its pipe stays open (closing it would stop the process), without holding this one open.
    (this.child?.stdio[3] as Socket | null | undefined)?.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.unwatch();
    clearTimeout(this.restart);
    if (this.adopted) {
      clearInterval(this.adopted.poll);
      return terminateProcess(this.adopted.id, 15_000);
    }
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    child.kill('SIGCONT'); // a stopped process drains only once it runs again
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    await exited;
    clearTimeout(timer);
  }
}

/**
 * A `prime-rl <args>` child process with output appended to `logFile`, with `env` added to this
 * process's environment. It dies with this process: it watches a pipe from us (see
 * `watchParentPipe`), which the kernel closes however we die.
 */
export function cliProcess(
  args: string[],
  logFile: string,
  env: Record<string, string> = {},
  jobStep?: (argv: string[]) => string[],
): () => ChildProcess {
  return () => {
    const fd = fs.openSync(logFile, 'a');
    const options = parentPipeOptions(['ignore', fd, fd]);
    const argv = [process.execPath, path.join(projectRoot, 'bin', 'prime-rl.js'), ...args];
    let child: ChildProcess;
    if (jobStep) {
      // A SLURM job step (lib/launch/slurm.ts): the pipe stays here (srun carries stdio only), so
      // its liveness is srun's; the job ends every step with it.
      const { [PARENT_PIPE_ENV]: _pipe, ...rest } = options.env ?? {};
      const [cmd, ...stepArgs] = jobStep(argv);
      child = spawn(cmd!, stepArgs, { ...options, env: { ...rest, ...env } });
    } else {
      child = spawn(argv[0]!, argv.slice(1), { ...options, env: { ...options.env, ...env } });
    }
    fs.closeSync(fd);
    return child;
  };
}

/** Writes `value` as JSON to `file` (atomically); returns `file`. */
export function writeJson(file: string, value: unknown): string {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  writeFileAtomic(file, `${JSON.stringify(value, null, 2)}\n`);
  return file;
}

/** The local processes of a run, as `<run>/launcher.json` names them. */
export type Pool = 'temporal' | 'inference' | 'cpu' | 'trainer';

/**
 * `<run>/launcher.json`, while a launcher runs the run: that launcher and the processes it started,
 * so that the next launch of the run can tell a launcher still running from one that was killed, and
 * find what the killed one left.
 */
export interface LauncherRecord {
  launcher: ProcessId;
  /** By pool, trainer ranks 1..N-1 as `trainer-<rank>`, inference replicas 1..N-1 as `inference-<i>`. */
  processes: Partial<Record<Exclude<Pool, 'temporal'> | `trainer-${number}` | `inference-${number}`, ProcessId>>;
}

export function readLauncherRecord(layout: RunLayout): LauncherRecord | undefined {
  try {
    const raw = JSON.parse(fs.readFileSync(layout.launcherFile, 'utf8')) as {
      launcher?: unknown;
      processes?: Record<string, unknown>;
    };
    const launcher = asProcessId(raw.launcher);
    if (launcher === undefined) return undefined;
    const processes: LauncherRecord['processes'] = {};
    for (const [name, value] of Object.entries(raw.processes ?? {})) {
      if (!['inference', 'cpu', 'trainer'].includes(name) && !/^(trainer|inference)-\d+$/.test(name)) continue;
      const id = asProcessId(value);
      if (id) processes[name as keyof LauncherRecord['processes']] = id;
    }
    return { launcher, processes };
  } catch {
    return undefined;
  }
}
