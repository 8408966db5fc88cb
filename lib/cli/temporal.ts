/**
 * `prime-rl temporal start|stop|status`: the local Temporal dev server (SQLite under
 * `<output_dir>/temporal/`, gRPC and UI on 127.0.0.1, metrics on temporal.metrics_port). `start`
 * runs in the foreground until Ctrl-C; `start --detach` leaves it running and records its pid for
 * `stop` (as the launcher records the server it starts: `stop` also ends one that a killed launcher
 * left behind). `status` checks the configured server (TEMPORAL_*, temporal.toml, temporal.*) when
 * there is one: reachable, TLS and API key accepted.
 */
import { z } from 'zod';
import { temporalCommandSchema, type TemporalCommandConfig } from '../config/schemas';
import { connectClient, describeTarget, temporalTarget } from '../temporal/connection';
import { isRunning, terminateProcess } from '../proc';
import {
  devServerOptions,
  forgetDevServer,
  isListening,
  recordDevServer,
  runningDevServer,
  startDevServer,
} from '../temporal/devserver';
import { CommandError } from '../failures';
import { command, type Command } from './command';

/** The pid of the dev server recorded for this output dir, if that process still runs. */
const readPid = (c: TemporalCommandConfig): number | undefined => runningDevServer(c.output_dir)?.pid;

async function start(c: TemporalCommandConfig & { detach: boolean }): Promise<void> {
  const { ip, port } = c.temporal;
  if (await isListening(ip, port)) {
    process.stdout.write(`Temporal is already listening on ${ip}:${port}; reusing it.\n`);
    return;
  }
  // The namespace the other commands will use on it (temporal.namespace, TEMPORAL_NAMESPACE, a profile's).
  const { namespace } = temporalTarget({ ...c.temporal, address: `${ip}:${port}` });
  const opts = { ...devServerOptions(c.temporal, c.output_dir, namespace), detached: c.detach };
  const { child, endpoint } = await startDevServer(opts);
  process.stdout.write(
    `Temporal dev server on ${endpoint.address} (namespace ${endpoint.namespace})\n` +
      `  UI:       ${endpoint.uiUrl}\n  metrics:  http://${ip}:${opts.metricsPort}/metrics\n` +
      `  database: ${opts.dbFile}\n  log:      ${opts.logFile}\n`,
  );
  if (c.detach) {
    recordDevServer(c.output_dir, { pid: child.pid!, port: c.temporal.port });
    process.stdout.write(`Detached (pid ${child.pid}); stop it with 'prime-rl temporal stop'.\n`);
    return;
  }
  process.stdout.write('Press Ctrl-C to stop.\n');
  await new Promise<void>((resolve) => {
    const stop = () => void endpoint.stop().then(resolve);
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
    child.once('exit', () => resolve());
  });
  process.stdout.write('Temporal dev server stopped.\n');
}

async function stop(c: TemporalCommandConfig): Promise<void> {
  const server = runningDevServer(c.output_dir);
  if (server === undefined) {
    const listening = await isListening(c.temporal.ip, c.temporal.port);
    throw new CommandError(
      listening
        ? `a server listens on ${c.temporal.ip}:${c.temporal.port} but was not started with 'temporal start --detach' here; stop it where it was started`
        : 'no detached Temporal dev server is running',
    );
  }
  if (server.owner && isRunning(server.owner)) {
    throw new CommandError(
      `the Temporal dev server (pid ${server.pid}) belongs to the running launcher pid ${server.owner.pid}, which would restart it; stop that command instead`,
    );
  }
  await terminateProcess(server, 15_000);
  forgetDevServer(c.output_dir, server.pid);
  process.stdout.write(`Temporal dev server (pid ${server.pid}) stopped.\n`);
}

async function status(c: TemporalCommandConfig): Promise<void> {
  const target = temporalTarget(c.temporal);
  if (target.configured) {
    // Fails within seconds saying what to set when TLS or the API key is refused.
    const connection = await connectClient(target);
    try {
      const info = await connection.workflowService.getSystemInfo({});
      process.stdout.write(`Temporal ${info.serverVersion ?? ''} reachable at ${describeTarget(target)}\n`);
    } finally {
      await connection.close();
    }
    return;
  }
  const { ip, port, ui_port } = c.temporal;
  const up = await isListening(ip, port);
  const pid = readPid(c);
  process.stdout.write(
    up
      ? `Temporal listening on ${ip}:${port} (UI http://${ip}:${ui_port})${pid ? `, detached pid ${pid}` : ''}\n`
      : `No Temporal server on ${ip}:${port}\n`,
  );
}

export const temporalCommands: Record<string, Command> = {
  start: command({
    summary: 'start a local Temporal dev server (foreground; --detach to background it)',
    schema: temporalCommandSchema.extend({
      detach: z.boolean().default(false).describe('keep the server running in the background after this command exits'),
    }),
    run: start,
  }),
  stop: command({ summary: 'stop a server started with --detach', schema: temporalCommandSchema, run: stop }),
  status: command({
    summary: 'check the configured Temporal server (TLS, API key), or tell whether a local one listens',
    schema: temporalCommandSchema,
    run: status,
  }),
};
