/**
 * `prime-rl temporal start|stop|status`: the local Temporal dev server (SQLite under
 * `<output_dir>/temporal/`, gRPC and UI on 127.0.0.1). `start` runs in the foreground until Ctrl-C;
 * `start --detach` leaves it running and records its pid for `stop`.
 */
import * as fs from 'node:fs';
import { z } from 'zod';
import { temporalCommandSchema, type TemporalCommandConfig } from '../config/schemas';
import { devServerOptions, devServerPidFile, isListening, recordDevServerPid, startDevServer } from '../temporal/devserver';
import { command, CommandError, type Command } from './command';

const pidFile = (c: TemporalCommandConfig) => devServerPidFile(c.output_dir);

function readPid(c: TemporalCommandConfig): number | undefined {
  try {
    const pid = Number(fs.readFileSync(pidFile(c), 'utf8').trim());
    process.kill(pid, 0);
    return pid;
  } catch {
    return undefined;
  }
}

async function start(c: TemporalCommandConfig & { detach: boolean }): Promise<void> {
  const { ip, port } = c.temporal;
  if (await isListening(ip, port)) {
    process.stdout.write(`Temporal is already listening on ${ip}:${port}; reusing it.\n`);
    return;
  }
  const opts = { ...devServerOptions(c.temporal, c.output_dir), detached: c.detach };
  const { child, endpoint } = await startDevServer(opts);
  process.stdout.write(
    `Temporal dev server on ${endpoint.address} (namespace ${endpoint.namespace})\n` +
      `  UI:       ${endpoint.uiUrl}\n  database: ${opts.dbFile}\n  log:      ${opts.logFile}\n`,
  );
  if (c.detach) {
    recordDevServerPid(c.output_dir, child.pid!);
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
  const pid = readPid(c);
  if (pid === undefined) {
    const listening = await isListening(c.temporal.ip, c.temporal.port);
    throw new CommandError(
      listening
        ? `a server listens on ${c.temporal.ip}:${c.temporal.port} but was not started with 'temporal start --detach' here; stop it where it was started`
        : 'no detached Temporal dev server is running',
    );
  }
  process.kill(pid, 'SIGTERM');
  const deadline = Date.now() + 15_000;
  while (readPid(c) !== undefined && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  if (readPid(c) !== undefined) process.kill(pid, 'SIGKILL');
  fs.rmSync(pidFile(c), { force: true });
  process.stdout.write(`Temporal dev server (pid ${pid}) stopped.\n`);
}

async function status(c: TemporalCommandConfig): Promise<void> {
  const { ip, port, ui_port } = c.temporal;
  const up = await isListening(ip, port);
  const pid = readPid(c);
  process.stdout.write(
    up ? `Temporal listening on ${ip}:${port} (UI http://${ip}:${ui_port})${pid ? `, detached pid ${pid}` : ''}\n` : `No Temporal server on ${ip}:${port}\n`,
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
  status: command({ summary: 'tell whether a server is listening', schema: temporalCommandSchema, run: status }),
};
