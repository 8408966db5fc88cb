/**
 * Process supervision for the launcher: processes kept alive (restarted when they die), started as
 * `prime-rl` child processes that die with the launcher, and `<run>/launcher.json`, which lets the
 * next launch of a run find what a killed launcher left.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { writeFileAtomic } from '../atomic';
import { projectRoot } from '../paths';
import { asProcessId, isRunning, parentPipeOptions, processId, terminateProcess, type ProcessId } from '../proc';
import type { RunLayout } from '../run/layout';

/**
 * A process kept alive: restarted (after a short pause) whenever it exits, until stopped. It is our
 * child, or one that a killed launcher left running (adopted: no exit event reaches us, so it is
 * polled). `onStart` sees each process it starts, to record it.
 */
export class Supervised {
  private child?: ChildProcess;
  private adopted?: { id: ProcessId; poll: NodeJS.Timeout };
  /** The pending restart after an exit (cleared by stop and release: no timer outlives supervision). */
  private restart?: NodeJS.Timeout;
  private stopped = false;
  restarts = 0;

  constructor(
    readonly name: string,
    private readonly start: () => ChildProcess,
    private readonly log: (line: string) => void,
    private readonly onStart: (id: ProcessId) => void = () => undefined,
    adopt?: ProcessId,
  ) {
    if (adopt) this.adopt(adopt);
    else this.launch();
  }

  private exited(how: string): void {
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
  }

  private adopt(id: ProcessId): void {
    const poll = setInterval(() => {
      if (isRunning(id)) return;
      clearInterval(poll);
      this.adopted = undefined;
      this.exited(`pid ${id.pid} gone`);
    }, 500);
    this.adopted = { id, poll };
  }

  get pid(): number | undefined {
    return this.adopted?.id.pid ?? this.child?.pid;
  }

  /** Stops supervising and leaves the process running, no longer holding this process open. */
  release(): void {
    this.stopped = true;
    clearTimeout(this.restart);
    clearInterval(this.adopted?.poll);
    this.child?.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.restart);
    if (this.adopted) {
      clearInterval(this.adopted.poll);
      return terminateProcess(this.adopted.id, 15_000);
    }
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    await exited;
    clearTimeout(timer);
  }
}

/**
 * A `prime-rl <args>` child process with output appended to `logFile`. It dies with this process:
 * it watches a pipe from us (see `watchParentPipe`), which the kernel closes however we die.
 */
export function cliProcess(args: string[], logFile: string): () => ChildProcess {
  return () => {
    const fd = fs.openSync(logFile, 'a');
    const child = spawn(
      process.execPath,
      [path.join(projectRoot, 'bin', 'prime-rl.js'), ...args],
      parentPipeOptions(['ignore', fd, fd]),
    );
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
