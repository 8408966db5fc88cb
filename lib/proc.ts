/**
 * Processes that outlive the one that started them: a pid recorded in a file is only trusted
 * together with the process's start time, so a pid the OS has since given to another process is
 * never signalled; and a child that must die with its parent watches a pipe from it.
 */
import { execFileSync, type SpawnOptions } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';

/** A process as recorded in a pid file: pid plus start time (pids are recycled, the pair is not). */
export interface ProcessId {
  pid: number;
  start: string;
}

/**
 * When a live process started, as an opaque string (Linux: /proc/<pid>/stat field 22, clock ticks
 * since boot; elsewhere `ps -o lstart`); undefined when no such process is running (a zombie counts
 * as gone).
 */
export function processStart(pid: number): string | undefined {
  if (!Number.isInteger(pid) || pid <= 0) return undefined;
  if (process.platform === 'linux') {
    let stat: string;
    try {
      stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    } catch {
      return undefined;
    }
    // "pid (comm) state ppid ...": comm may hold spaces and ')', so count fields after the last ')'.
    const fields = statFields(stat);
    // A zombie main thread whose other threads still run is a process still exiting: it holds its
    // files and sockets (a listening port) until the last thread is gone, which for a large process
    // (unmapping gigabytes, a thread in a slow syscall) takes a while after the main thread died.
    const gone = (state: string | undefined) => state === undefined || state === 'Z' || state === 'X';
    if (gone(fields[0]) && !threadStates(pid).some((s) => !gone(s))) return undefined;
    return fields[19];
  }
  try {
    const out = execFileSync('ps', ['-o', 'stat=,lstart=', '-p', String(pid)], { encoding: 'utf8' }).trim();
    return out === '' || out.startsWith('Z') ? undefined : out.replace(/^\S+\s+/, '');
  } catch {
    return undefined;
  }
}

/** The fields of a /proc stat line after `pid (comm)`: comm may hold spaces and ')'. */
function statFields(stat: string): string[] {
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
}

/** The states (R, S, D, T, Z, ...) of a process's threads, from /proc; none where it is gone. */
function threadStates(pid: number): string[] {
  let tids: string[];
  try {
    tids = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    return [];
  }
  return tids.flatMap((tid) => {
    try {
      return [statFields(fs.readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8'))[0]];
    } catch {
      return [];
    }
  });
}

/**
 * The scheduler state of a live process's main thread (`T`: stopped, by SIGSTOP or a debugger;
 * `D`: in an uninterruptible syscall), from /proc; undefined where it is gone or /proc is absent.
 */
export function processState(pid: number): string | undefined {
  try {
    return statFields(fs.readFileSync(`/proc/${pid}/stat`, 'utf8'))[0];
  } catch {
    return undefined;
  }
}

/** The identity of a running process, for a pid file; undefined if it is not running. */
export function processId(pid: number | undefined): ProcessId | undefined {
  const start = pid === undefined ? undefined : processStart(pid);
  return start === undefined ? undefined : { pid: pid!, start };
}

/** True while the very process `id` recorded is running (not another one that got its pid). */
export function isRunning(id: ProcessId): boolean {
  return processStart(id.pid) === id.start;
}

/** A `ProcessId` read back from JSON, or undefined if the value is not one. */
export function asProcessId(value: unknown): ProcessId | undefined {
  const v = value as Partial<ProcessId> | undefined;
  return v && Number.isInteger(v.pid) && typeof v.start === 'string' ? { pid: v.pid!, start: v.start } : undefined;
}

/** How long a process may take to go after SIGKILL before it counts as stuck in the kernel. */
export const KILL_WAIT_MS = 30_000;

/**
 * Stops the recorded process if it is still that process: SIGTERM (and SIGCONT, should it be
 * stopped), then SIGKILL after `graceMs`. Resolves once it is gone, every thread of it (so its
 * ports are free); throws, naming it, if it is still there `KILL_WAIT_MS` after the SIGKILL (a
 * thread stuck in an uninterruptible syscall: a hung disk or network file system).
 */
export async function terminateProcess(id: ProcessId, graceMs = 10_000): Promise<void> {
  const signal = (s: NodeJS.Signals) => {
    if (!isRunning(id)) return;
    try {
      process.kill(id.pid, s);
    } catch {
      // gone meanwhile
    }
  };
  signal('SIGTERM');
  signal('SIGCONT');
  const killAt = Date.now() + graceMs;
  while (isRunning(id)) {
    if (Date.now() > killAt) {
      signal('SIGKILL');
      if (Date.now() > killAt + KILL_WAIT_MS)
        throw new Error(
          `process ${id.pid} is still there ${KILL_WAIT_MS / 1000} s after SIGKILL (threads in states ${threadStates(id.pid).join('') || '?'}: D is a syscall that cannot be interrupted, e.g. on a hung disk or network file system)`,
        );
    }
    await sleep(100);
  }
}

/**
 * The environment variable through which a parent hands a child the fd of a pipe whose other end
 * only the parent holds: the kernel closes it when the parent dies, however it dies (SIGKILL too).
 */
export const PARENT_PIPE_ENV = 'PRIME_RL_PARENT_PIPE_FD';

/** spawn() options giving the child such a pipe (stdio[3]); use with `watchParentPipe` in the child. */
export function parentPipeOptions(
  stdio: ['ignore' | 'inherit' | number, 'ignore' | 'inherit' | number, 'ignore' | 'inherit' | number],
): SpawnOptions {
  return { stdio: [...stdio, 'pipe'], env: { ...process.env, [PARENT_PIPE_ENV]: '3' } };
}

/**
 * What a child writes back on that pipe: a beat every `PIPE_BEAT_MS` from its event loop (a child
 * stopped, or with its event loop blocked, sends none: its parent finds it silent), and once
 * `PIPE_READY` when it is up (a server listening, a worker polling). Beats before that only say
 * the process is not stopped: start-up may block its event loop (loading a model).
 */
export const PIPE_BEAT = '.';
export const PIPE_READY = 'R';
export const PIPE_BEAT_MS = 1_000;

let parentPipe: net.Socket | undefined;

/**
 * In a child started with `parentPipeOptions`: when the parent dies, stop as the parent would have
 * stopped us (SIGTERM: drain and exit), and SIGKILL ourselves if that takes over `graceMs`; and beat
 * to the parent meanwhile. A no-op in a process not started that way.
 */
export function watchParentPipe(graceMs = 15_000): void {
  const fd = Number(process.env[PARENT_PIPE_ENV]);
  // Not for our own children: a forked child's fd 3 is its IPC channel.
  delete process.env[PARENT_PIPE_ENV];
  if (!Number.isInteger(fd) || fd < 3) return;
  let pipe: net.Socket;
  try {
    pipe = new net.Socket({ fd, readable: true, writable: true });
  } catch {
    return;
  }
  const parentGone = () => {
    clearInterval(beats);
    parentPipe = undefined;
    process.stderr.write('the process that started this one is gone (its pipe closed): stopping\n');
    setTimeout(() => process.kill(process.pid, 'SIGKILL'), graceMs).unref();
    process.kill(process.pid, 'SIGTERM');
  };
  pipe.once('close', parentGone);
  pipe.on('error', () => undefined);
  pipe.resume();
  // Watching must not keep the process alive.
  pipe.unref();
  parentPipe = pipe;
  const beat = () => void pipe.write(PIPE_BEAT);
  const beats = setInterval(beat, PIPE_BEAT_MS);
  beats.unref();
  beat();
}

/** Tells the parent (if it watches, see `watchParentPipe`) that this process is up: from now on a silence is a hang. */
export function announceReady(): void {
  parentPipe?.write(PIPE_READY);
}

/**
 * A process the launcher starts writes its stdout and stderr to log files in the run folder: on a
 * full disk a write fails (ENOSPC), and the stream's unhandled error would kill the process. The
 * lines written while the disk is full are lost instead, and logging goes on once there is space.
 */
export function keepLoggingOnFullDisk(): void {
  for (const stream of [process.stdout, process.stderr]) {
    stream.on('error', (e: NodeJS.ErrnoException) => {
      if (e.code === 'ENOSPC' || e.code === 'EDQUOT') return;
      throw e;
    });
  }
}
