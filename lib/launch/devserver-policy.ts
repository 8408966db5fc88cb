/**
 * Which Temporal server a launch uses, and whether it stops it at its end. The configured server
 * (temporal.address) is only used. Otherwise a local dev server: one a killed launcher of this
 * output dir started is taken over; one already listening (another command's) is used, not owned;
 * else one is started. An owned server runs in its own process group (whether it outlives the run
 * is for `releaseDevServer` to decide, not a Ctrl-C) and is restarted on the same SQLite file, so
 * workflows and their history survive.
 */
import type { ChildProcess } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client, Connection } from '@temporalio/client';
import type { TemporalConfig } from '../config/schemas';
import { isRunning, type ProcessId } from '../proc';
import {
  devServerOptions,
  forgetDevServer,
  isListening,
  recordDevServer,
  runningDevServer,
  spawnDevServer,
  startDevServer,
} from '../temporal/devserver';
import { Supervised, type Liveness } from './supervise';

/** The local dev server a launch owns (none: it uses a server it does not own). */
export interface OwnedDevServer {
  process: Supervised;
  port: number;
  /** Ends the liveness probe's connection. */
  closeProbe(): Promise<void>;
}

/**
 * The liveness of the dev server at `address` (supervise.ts): its gRPC health check, over one
 * connection made at the first probe and kept (it reconnects to a restarted server by itself). A
 * frozen server accepts TCP connections (the kernel does) but answers nothing.
 */
function healthProbe(address: string, deadlineMs: number): { liveness: Liveness; close(): Promise<void> } {
  let connection: Promise<Connection> | undefined;
  let closed = false;
  const probe = async (signal: AbortSignal) => {
    if (closed) throw new Error('probe closed');
    connection ??= Connection.connect({ address, connectTimeout: 5_000 }).catch((e: unknown) => {
      connection = undefined;
      throw e;
    });
    const c = await connection;
    await c.withAbortSignal(signal, () => c.healthService.check({}));
  };
  const close = async () => {
    closed = true;
    const c = await connection?.catch(() => undefined);
    connection = undefined;
    await c?.close();
  };
  return { liveness: { deadlineMs, probe }, close };
}

/** The `host:port` a launch connects to. */
export function temporalAddress(temporal: TemporalConfig): string {
  return temporal.address ?? `${temporal.ip}:${temporal.port}`;
}

/**
 * Starts or takes over the local dev server of `outputDir` when the launch needs one; `self` (the
 * launcher) is recorded as its owner, so that a later launch can take it over if we are killed.
 */
export async function acquireDevServer(
  temporal: TemporalConfig,
  outputDir: string,
  self: ProcessId,
  say: (line: string) => void,
  livenessMs: number,
): Promise<OwnedDevServer | undefined> {
  if (temporal.address) return undefined;
  const address = temporalAddress(temporal);
  const health = healthProbe(address, livenessMs);
  const opts = { ...devServerOptions(temporal, outputDir), detached: true };
  const record = (pid: number | undefined) =>
    pid !== undefined && recordDevServer(outputDir, { pid, port: opts.port, owner: self });
  const left = runningDevServer(outputDir);
  if (left && left.port === opts.port && left.owner && !isRunning(left.owner)) {
    record(left.pid);
    const server = new Supervised(
      'temporal',
      () => spawnDevServer(opts),
      say,
      (id) => record(id.pid),
      left,
      health.liveness,
    );
    say(`took over the Temporal dev server on ${address} (pid ${left.pid}) of the killed launcher ${left.owner.pid}`);
    const deadline = Date.now() + 60_000;
    while (!(await isListening(opts.ip, opts.port))) {
      if (Date.now() > deadline) {
        // Ours now, and useless: stopped, as the launch's end would.
        const pid = server.pid;
        await server.stop();
        await health.close();
        if (pid !== undefined) forgetDevServer(outputDir, pid);
        throw new Error(`Temporal dev server did not open ${address} within 60 s; see ${opts.logFile}`);
      }
      await sleep(200);
    }
    return { process: server, port: opts.port, closeProbe: health.close };
  }
  if (await isListening(temporal.ip, temporal.port)) return undefined;
  let first: ChildProcess | undefined = (await startDevServer(opts, (child) => record(child.pid))).child;
  const server = new Supervised(
    'temporal',
    () => first ?? spawnDevServer(opts),
    say,
    (id) => record(id.pid),
    undefined,
    health.liveness,
  );
  first = undefined;
  say(`Temporal dev server on ${address} (UI http://${opts.ip}:${opts.uiPort})`);
  return { process: server, port: opts.port, closeProbe: health.close };
}

/**
 * At the end of a launch: stops its dev server, unless another command (which found it listening)
 * still runs a workflow on it; then it is left running, recorded without an owner.
 */
export async function releaseDevServer(
  server: OwnedDevServer,
  temporal: TemporalConfig,
  outputDir: string,
  runName: string,
  say: (line: string) => void,
): Promise<void> {
  await server.closeProbe();
  const others = await otherOpenWorkflows(temporalAddress(temporal), temporal.namespace, runName).catch(() => []);
  const pid = server.process.pid;
  if (others.length === 0 || pid === undefined) {
    await server.process.stop();
    if (pid !== undefined) forgetDevServer(outputDir, pid);
  } else {
    server.process.release();
    recordDevServer(outputDir, { pid, port: server.port });
    say(
      `Temporal dev server left running (pid ${pid}) for open workflows ${others.join(', ')}; 'prime-rl temporal stop --output-dir ${outputDir}' stops it`,
    );
  }
}

/** Ids of the workflows running on a Temporal server, except `own` and its child workflows. */
async function otherOpenWorkflows(address: string, namespace: string, own: string): Promise<string[]> {
  const connection = await Connection.connect({ address, connectTimeout: 5000 });
  try {
    const ids: string[] = [];
    for await (const w of new Client({ connection, namespace }).workflow.list({
      query: 'ExecutionStatus = "Running"',
    })) {
      if (![w.workflowId, w.parentExecution?.workflowId, w.rootExecution?.workflowId].includes(own))
        ids.push(w.workflowId);
    }
    return ids;
  } finally {
    await connection.close();
  }
}
