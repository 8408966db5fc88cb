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
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return fields[0] === 'Z' || fields[0] === 'X' ? undefined : fields[19];
  }
  try {
    const out = execFileSync('ps', ['-o', 'stat=,lstart=', '-p', String(pid)], { encoding: 'utf8' }).trim();
    return out === '' || out.startsWith('Z') ? undefined : out.replace(/^\S+\s+/, '');
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

/**
 * Stops the recorded process if it is still that process: SIGTERM (and SIGCONT, should it be
 * stopped), then SIGKILL after `graceMs`. Resolves once it is gone.
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
  const deadline = Date.now() + graceMs;
  while (isRunning(id)) {
    if (Date.now() > deadline) signal('SIGKILL');
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
 * In a child started with `parentPipeOptions`: when the parent dies, stop as the parent would have
 * stopped us (SIGTERM: drain and exit), and SIGKILL ourselves if that takes over `graceMs`. A no-op
 * in a process not started that way.
 */
export function watchParentPipe(graceMs = 15_000): void {
  const fd = Number(process.env[PARENT_PIPE_ENV]);
  // Not for our own children: a forked child's fd 3 is its IPC channel.
  delete process.env[PARENT_PIPE_ENV];
  if (!Number.isInteger(fd) || fd < 3) return;
  let pipe: net.Socket;
  try {
    pipe = new net.Socket({ fd, readable: true, writable: false });
  } catch {
    return;
  }
  const parentGone = () => {
    process.stderr.write('the process that started this one is gone (its pipe closed): stopping\n');
    setTimeout(() => process.kill(process.pid, 'SIGKILL'), graceMs).unref();
    process.kill(process.pid, 'SIGTERM');
  };
  pipe.once('close', parentGone);
  pipe.on('error', () => undefined);
  pipe.resume();
  // Watching must not keep the process alive.
  pipe.unref();
}
