/**
 * For tests that launch the built CLI (`bin/prime-rl.js`, dist/) as real processes and kill them:
 * what /proc says about a process, and launchers that are always cleaned up, even when a test fails.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { freePort } from '../../lib/net';
import { projectRoot } from '../../lib/paths';

/** ppid, process group and state of a live process (a zombie counts as gone), from /proc. */
export function procStat(pid: number): { ppid: number; pgid: number; state: string } | undefined {
  let stat: string;
  try {
    stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the last ')'.
  const [state, ppid, pgid] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return state === 'Z' || state === 'X' ? undefined : { ppid: Number(ppid), pgid: Number(pgid), state };
}

export const isRunning = (pid: number) => procStat(pid) !== undefined;

export function cmdline(pid: number): string {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ');
  } catch {
    return '';
  }
}

/** Live processes whose parent is `pid`. */
export function childrenOf(pid: number): number[] {
  return fs
    .readdirSync('/proc')
    .filter((n) => /^\d+$/.test(n))
    .map(Number)
    .filter((p) => procStat(p)?.ppid === pid);
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Whether `p` settles within `ms`. The timer is cleared either way: a pending one (as a bare
 * `Promise.race` with `sleep` leaves) keeps jest's process alive after the run ("Jest did not exit
 * one second after the test run has completed").
 */
export async function settlesWithin(p: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p.then(
        () => true,
        () => true,
      ),
      new Promise<boolean>((r) => (timer = setTimeout(() => r(false), ms))),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** Waits until `ok()` holds; fails with `what` after `limitMs` (a bound on a hang, not a timing goal). */
export async function until(what: string, ok: () => boolean | Promise<boolean>, limitMs = 120_000): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (!(await ok())) {
    if (Date.now() > deadline) throw new Error(`gave up waiting: ${what}`);
    await sleep(200);
  }
}

/** The lines of a run's metrics.jsonl, read as plain JSON lines (no de-duplication, nothing skipped). */
export function metricLines(file: string): { step: number; [key: string]: unknown }[] {
  if (!fs.existsSync(file)) return [];
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as { step: number });
}

export const metricSteps = (file: string): number[] => metricLines(file).map((l) => l.step);

export interface CliLaunch {
  child: ChildProcess;
  /** Output (stdout and stderr) so far. */
  output(): string;
  /** Exit code, or the signal's name. */
  exited: Promise<number | string>;
  /** The same, once it has exited. */
  exit?: number | string;
}

/**
 * `prime-rl <args>` processes, each in its own process group (its children stay in it, even once
 * orphaned), and every process id they are known to have. `cleanup()` SIGKILLs all of them.
 */
export class CliProcesses {
  private readonly groups = new Set<number>();
  private readonly pids = new Set<number>();

  constructor(private readonly logDir: string) {
    fs.mkdirSync(logDir, { recursive: true });
  }

  /** `prefix`: a command that runs the CLI, e.g. `ip netns exec NS` (it must exec it, keeping the pid). */
  start(args: string[], prefix: string[] = []): CliLaunch {
    const logFile = path.join(this.logDir, `cli-${this.groups.size}.log`);
    const fd = fs.openSync(logFile, 'w');
    const argv = [...prefix, process.execPath, path.join(projectRoot, 'bin', 'prime-rl.js'), ...args];
    const child = spawn(argv[0], argv.slice(1), {
      stdio: ['ignore', fd, fd],
      detached: true,
    });
    fs.closeSync(fd);
    this.groups.add(child.pid!);
    const launch: CliLaunch = {
      child,
      output: () => fs.readFileSync(logFile, 'utf8'),
      exited: new Promise((resolve) =>
        child.once('exit', (code, signal) => resolve((launch.exit = code ?? signal ?? -1))),
      ),
    };
    return launch;
  }

  /** Also kill this process (and its group) at cleanup: e.g. a detached Temporal dev server. */
  track(pid: number): void {
    this.pids.add(pid);
  }

  cleanup(): void {
    const kill = (id: number) => {
      try {
        process.kill(id, 'SIGKILL');
      } catch {
        // already gone
      }
    };
    for (const g of this.groups) kill(-g);
    for (const p of this.pids) {
      kill(-p);
      kill(p);
    }
  }
}

/**
 * `prime-rl inference` serving `modelDir` as a process of `procs` on a free port (one thread), once
 * it answers `/health`: a server a test can SIGSTOP or SIGKILL.
 */
export async function inferenceProcess(
  procs: CliProcesses,
  modelDir: string,
  seqLen: number,
): Promise<{ launch: CliLaunch; url: string }> {
  const port = await freePort();
  const launch = procs.start([
    'inference',
    '--model.name',
    modelDir,
    '--seq-len',
    String(seqLen),
    '--threads',
    '1',
    '--server.port',
    String(port),
  ]);
  const url = `http://127.0.0.1:${port}`;
  await until(`the inference process on port ${port} to answer /health`, () =>
    fetch(`${url}/health`).then(
      (r) => r.ok,
      () => false,
    ),
  );
  return { launch, url };
}
