/** The local Temporal dev server: the binary scripts/setup.sh built, a real worker, a real workflow. */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { NativeConnection, Worker } from '@temporalio/worker';
import { temporalSchema } from '../lib/config/schemas';
import { projectRoot } from '../lib/paths';
import { requireServer, temporalTarget } from '../lib/temporal/connection';
import { isListening, lostOwnPort, startDevServer } from '../lib/temporal/devserver';
import { freePort } from '../lib/net';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-temporal-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

test('starts the dev server, runs a workflow through a real worker, stops it', async () => {
  const [port, uiPort] = [await freePort(), await freePort()];
  const dbFile = path.join(tmp, 'a', 'temporal.db');
  const { endpoint } = await startDevServer({
    ip: '127.0.0.1',
    port,
    uiPort,
    namespace: 'default',
    dbFile,
    logFile: path.join(tmp, 'a', 'server.log'),
  });
  try {
    expect(endpoint.address).toBe(`127.0.0.1:${port}`);
    expect(fs.existsSync(dbFile)).toBe(true);

    // With no address configured, a worker or `runs` uses the local dev server if it listens...
    const env = { HOME: tmp };
    const local = temporalTarget(temporalSchema.parse({ port, ui_port: uiPort }), env);
    expect(local).toMatchObject({ address: endpoint.address, configured: false, namespace: 'default' });
    await requireServer(local);
    // ... and never starts one: none listening is an error that says how to start or name one.
    const none = temporalTarget(temporalSchema.parse({ port: await freePort() }), env);
    await expect(requireServer(none)).rejects.toThrow(
      /no Temporal server: none is configured .*prime-rl temporal start/,
    );

    const connection = await NativeConnection.connect({ address: endpoint.address });
    const worker = await Worker.create({
      connection,
      taskQueue: 'test',
      workflowsPath: require.resolve('./fixtures/echo-workflow'),
      activities: { shout: async (text: string) => text.toUpperCase() },
    });
    const client = new Client({ connection: await Connection.connect({ address: endpoint.address }) });
    const result = await worker.runUntil(
      client.workflow.execute('echo', { taskQueue: 'test', workflowId: `echo-${Date.now()}`, args: ['hello'] }),
    );
    expect(result).toBe('HELLO!');
    await client.connection.close();
    await connection.close();
  } finally {
    await endpoint.stop();
  }
  expect(await isListening('127.0.0.1', port)).toBe(false);
});

test('prime-rl temporal start --detach / status / stop, its metrics on a fixed port', async () => {
  const [port, uiPort, metricsPort] = [await freePort(), await freePort(), await freePort()];
  const args = [
    '--output-dir',
    path.join(tmp, 'b'),
    '--temporal.port',
    String(port),
    '--temporal.ui-port',
    String(uiPort),
    '--temporal.metrics-port',
    String(metricsPort),
  ];
  const cli = (...a: string[]) =>
    spawnSync(process.execPath, [path.join(projectRoot, 'bin', 'prime-rl.js'), 'temporal', ...a, ...args], {
      encoding: 'utf8',
    });

  const started = cli('start', '--detach');
  expect(started.stderr).toBe('');
  expect(started.status).toBe(0);
  expect(started.stdout).toContain(`127.0.0.1:${port}`);
  expect(fs.existsSync(path.join(tmp, 'b', 'temporal', 'temporal.db'))).toBe(true);

  expect(started.stdout).toContain(`metrics:  http://127.0.0.1:${metricsPort}/metrics`);
  // The server's own Prometheus metrics, where a scraper configured once finds them.
  const metrics = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
  expect(metrics).toMatch(/^# TYPE \w+ /m);
  expect(metrics).toMatch(/^service_requests\{/m);

  expect(cli('status').stdout).toContain(`Temporal listening on 127.0.0.1:${port}`);
  expect(cli('start', '--detach').stdout).toContain('already listening');

  const stopped = cli('stop');
  expect(stopped.status).toBe(0);
  expect(await isListening('127.0.0.1', port)).toBe(false);
  expect(cli('status').stdout).toContain('No Temporal server');
  expect(cli('stop').status).toBe(1);
});

test('a dev server that exits during start-up is reported with the end of its log', async () => {
  // A folder where the SQLite database file should be: the server cannot open it and exits.
  const dbFile = path.join(tmp, 'fail', 'db');
  fs.mkdirSync(dbFile, { recursive: true });
  const start = startDevServer({
    ip: '127.0.0.1',
    port: await freePort(),
    uiPort: await freePort(),
    namespace: 'default',
    dbFile,
    logFile: path.join(tmp, 'fail', 'temporal.log'),
  });
  await expect(start).rejects.toThrow(
    /exited during start-up \(code [1-9]\d*, signal null\); \S+temporal\.log ends with:\n\S/,
  );
});

test('start-up is retried only when the server lost a port it picked itself', () => {
  const opts = { ip: '127.0.0.1', port: 7301, uiPort: 8301, namespace: 'default', dbFile: 'db', logFile: 'log' };
  const failure = (port: number) =>
    new Error(
      `Temporal dev server exited during start-up (code 1, signal null); log ends with:\n... failed listening for HTTP API on 127.0.0.1:${port}: listen tcp 127.0.0.1:${port}: bind: address already in use"`,
    );
  expect(lostOwnPort(failure(42929), opts)).toBe(true);
  expect(lostOwnPort(failure(7301), opts)).toBe(false);
  expect(lostOwnPort(failure(8301), opts)).toBe(false);
  expect(lostOwnPort(new Error('Temporal dev server exited during start-up (code 1, signal null)'), opts)).toBe(false);
});
