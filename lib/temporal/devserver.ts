/**
 * The local Temporal dev server: the `temporal` CLI binary that scripts/setup.sh builds, persisting
 * to a SQLite file under `<output_dir>/temporal/`, bound to 127.0.0.1, its Prometheus metrics on a
 * fixed port. `prime-rl temporal start` and the launcher of `rl`, `sft` and `eval` (when no server
 * is configured: lib/launch/devserver-policy.ts) start one; nothing else does.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { writeFileAtomic } from '../atomic';
import { devMetricsPort, type TemporalConfig } from '../config/schemas';
import { temporalCliPath } from '../paths';
import { asProcessId, isRunning, processId, type ProcessId } from '../proc';

export interface TemporalEndpoint {
  /** host:port for @temporalio/client and @temporalio/worker connections. */
  address: string;
  namespace: string;
  /** Web UI, when the server is a local dev server. */
  uiUrl?: string;
  /** Stops the server if this process started it; a no-op for a reused or remote server. */
  stop(): Promise<void>;
}

export interface DevServerOptions {
  ip: string;
  port: number;
  uiPort: number;
  /** Prometheus /metrics; unset = a free port the server picks. */
  metricsPort?: number;
  namespace: string;
  dbFile: string;
  /** Server output goes here (the dev server logs a lot; keep it out of the terminal). */
  logFile: string;
  /**
   * Its own process group, not holding this process open: a Ctrl-C in the terminal does not reach
   * it, and it outlives this process unless stopped (`prime-rl temporal start --detach`; the
   * launcher, which stops it at the end unless other open workflows still use it).
   */
  detached?: boolean;
}

/** Where the dev server started for an output dir is recorded, for `prime-rl temporal stop` and re-runs. */
export function devServerPidFile(outputDir: string): string {
  return path.resolve(outputDir, 'temporal', 'server.pid');
}

/** A dev server that runs on its own (detached): who it is, where it listens, who looks after it. */
export interface DevServerRecord extends ProcessId {
  port: number;
  /**
   * The launcher that started it and restarts it if it dies; none once it is left running for
   * others (`temporal start --detach`, or a launcher that ended while other workflows used it).
   */
  owner?: ProcessId;
}

/** Records a detached dev server (`pid` must be running), so that `temporal stop` and later launchers find it. */
export function recordDevServer(outputDir: string, server: { pid: number; port: number; owner?: ProcessId }): void {
  const id = processId(server.pid);
  if (id === undefined) return;
  writeFileAtomic(
    devServerPidFile(outputDir),
    `${JSON.stringify({ ...id, port: server.port, ...(server.owner && { owner: server.owner }) })}\n`,
  );
}

/** The recorded dev server of an output dir if that very process still runs (a recycled pid is not it). */
export function runningDevServer(outputDir: string): DevServerRecord | undefined {
  let record: Partial<DevServerRecord>;
  try {
    record = JSON.parse(fs.readFileSync(devServerPidFile(outputDir), 'utf8')) as Partial<DevServerRecord>;
  } catch {
    return undefined;
  }
  const id = asProcessId(record);
  if (id === undefined || !isRunning(id) || !Number.isInteger(record.port)) return undefined;
  return { ...id, port: record.port!, ...(asProcessId(record.owner) && { owner: asProcessId(record.owner) }) };
}

/** Forgets the recorded dev server, if it is `pid` (stopped by whoever recorded it). */
export function forgetDevServer(outputDir: string, pid: number): void {
  try {
    if ((JSON.parse(fs.readFileSync(devServerPidFile(outputDir), 'utf8')) as { pid?: unknown }).pid === pid)
      fs.rmSync(devServerPidFile(outputDir), { force: true });
  } catch {
    // no record, or not one of ours
  }
}

/** True if something accepts TCP connections on host:port. */
export function isListening(host: string, port: number, timeoutMs = 500): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({ host, port });
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(timeoutMs, () => done(false));
    socket.once('connect', () => done(true));
    socket.once('error', () => done(false));
  });
}

function exited(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once('exit', () => resolve());
  });
}

/** Sends SIGTERM, waits up to `graceMs`, then SIGKILL. */
async function terminate(child: ChildProcess, graceMs = 10_000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
  await exited(child);
  clearTimeout(timer);
}

/** Spawns `temporal server start-dev` with its output appended to the log file; does not wait for it. */
export function spawnDevServer(opts: DevServerOptions): ChildProcess {
  fs.mkdirSync(path.dirname(opts.dbFile), { recursive: true });
  fs.mkdirSync(path.dirname(opts.logFile), { recursive: true });
  const log = fs.openSync(opts.logFile, 'a');
  const args = [
    'server',
    'start-dev',
    '--ip',
    opts.ip,
    '--port',
    String(opts.port),
    '--ui-port',
    String(opts.uiPort),
    ...(opts.metricsPort !== undefined ? ['--metrics-port', String(opts.metricsPort)] : []),
    '--db-filename',
    opts.dbFile,
    '--namespace',
    opts.namespace,
    '--log-level',
    'warn',
  ];
  const child = spawn(temporalCliPath, args, { stdio: ['ignore', log, log], detached: opts.detached ?? false });
  fs.closeSync(log);
  return child;
}

/** The last lines of a log: why a server that exited at once did so, even when its folder is gone later. */
function logTail(file: string, lines = 15): string {
  try {
    return fs.readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

/** Start-up attempts when the server loses a port it picked itself (below). */
const START_ATTEMPTS = 3;

/**
 * A start-up failure worth another attempt: the server could not bind a port it picked itself
 * (its HTTP API port, and its metrics port unless given: it finds a free one, closes it and binds
 * it again later, and on a busy machine another process can take it in between). Ports we were
 * given are not retried.
 */
export function lostOwnPort(e: unknown, opts: DevServerOptions): boolean {
  const m = /listen tcp [^\s]*:(\d+): bind: address already in use/.exec((e as Error).message ?? '');
  return m !== null && ![opts.port, opts.uiPort, opts.metricsPort].includes(Number(m[1]));
}

/**
 * Starts `temporal server start-dev` and resolves once its gRPC port and UI accept connections.
 * `onSpawn` sees the process at once, before it is ready (to record its pid before anything else).
 */
export async function startDevServer(
  opts: DevServerOptions,
  onSpawn?: (child: ChildProcess) => void,
): Promise<{ child: ChildProcess; endpoint: TemporalEndpoint }> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startDevServerOnce(opts, onSpawn);
    } catch (e) {
      if (attempt >= START_ATTEMPTS || !lostOwnPort(e, opts)) throw e;
    }
  }
}

async function startDevServerOnce(
  opts: DevServerOptions,
  onSpawn?: (child: ChildProcess) => void,
): Promise<{ child: ChildProcess; endpoint: TemporalEndpoint }> {
  if (!fs.existsSync(temporalCliPath)) {
    throw new Error(`Temporal CLI not found at ${temporalCliPath}: run 'bash scripts/setup.sh' first`);
  }
  if (await isListening(opts.ip, opts.port)) {
    throw new Error(`port ${opts.ip}:${opts.port} is already in use`);
  }
  const child = spawnDevServer(opts);
  onSpawn?.(child);
  const failed = new Promise<never>((_, reject) => {
    child.once('exit', (code, signal) =>
      reject(
        new Error(
          `Temporal dev server exited during start-up (code ${code}, signal ${signal}); ${opts.logFile} ends with:\n${logTail(opts.logFile)}`,
        ),
      ),
    );
    child.once('error', reject);
  });
  failed.catch(() => undefined);
  const ready = (async () => {
    const deadline = Date.now() + 60_000;
    while (!(await isListening(opts.ip, opts.port)) || !(await isListening(opts.ip, opts.uiPort))) {
      if (Date.now() > deadline)
        throw new Error(`Temporal dev server did not open ${opts.ip}:${opts.port} within 60 s; see ${opts.logFile}`);
      await sleep(100);
    }
  })();
  try {
    await Promise.race([ready, failed]);
  } catch (e) {
    await terminate(child);
    throw e;
  }
  if (opts.detached) child.unref();
  const endpoint: TemporalEndpoint = {
    address: `${opts.ip}:${opts.port}`,
    namespace: opts.namespace,
    uiUrl: `http://${opts.ip}:${opts.uiPort}`,
    stop: () => terminate(child),
  };
  return { child, endpoint };
}

/**
 * Dev-server options from a command's config: database and log under `<output_dir>/temporal/`;
 * `namespace` (the one the command uses) is created besides "default".
 */
export function devServerOptions(temporal: TemporalConfig, outputDir: string, namespace: string): DevServerOptions {
  const dir = path.resolve(outputDir, 'temporal');
  return {
    ip: temporal.ip,
    port: temporal.port,
    uiPort: temporal.ui_port,
    metricsPort: devMetricsPort(temporal),
    namespace,
    dbFile: path.join(dir, 'temporal.db'),
    logFile: path.join(dir, 'server.log'),
  };
}
