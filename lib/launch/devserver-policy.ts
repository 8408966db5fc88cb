/**
 * Which Temporal server a launch uses, and whether it stops it at its end. A configured server
 * (temporal.address, TEMPORAL_ADDRESS or a temporal.toml profile: lib/temporal/connection.ts) is
 * only used. Otherwise a local dev server: one a killed launcher of this
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
import { otherRunningWorkflows, type TemporalTarget } from '../temporal/connection';
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

/**
 * Starts or takes over the local dev server of `outputDir` when the launch needs one; `self` (the
 * launcher) is recorded as its owner, so that a later launch can take it over if we are killed.
 */
export async function acquireDevServer(
  temporal: TemporalConfig,
  target: TemporalTarget,
  outputDir: string,
  self: ProcessId,
  say: (line: string) => void,
  livenessMs: number,
): Promise<OwnedDevServer | undefined> {
  if (target.configured) return undefined;
  const address = target.address;
  const health = healthProbe(address, livenessMs);
  const opts = { ...devServerOptions(temporal, outputDir, target.namespace), detached: true };
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
  say(
    `Temporal dev server on ${address} (UI http://${opts.ip}:${opts.uiPort}, metrics http://${opts.ip}:${opts.metricsPort}/metrics)`,
  );
  return { process: server, port: opts.port, closeProbe: health.close };
}

/**
 * At the end of a launch: stops its dev server, unless another command (which found it listening)
 * still runs a workflow on it; then it is left running, recorded without an owner.
 */
export async function releaseDevServer(
  server: OwnedDevServer,
  target: TemporalTarget,
  outputDir: string,
  runName: string,
  say: (line: string) => void,
): Promise<void> {
  await server.closeProbe();
  const others = await othersOnServer(target.address, target.namespace, runName).catch(() => []);
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

/** Ids of the workflows running on the local dev server at `address`, except `own` and its children. */
async function othersOnServer(address: string, namespace: string, own: string): Promise<string[]> {
  const connection = await Connection.connect({ address, connectTimeout: 5000 });
  try {
    return await otherRunningWorkflows(new Client({ connection, namespace }), own);
  } finally {
    await connection.close();
  }
}
