/**
 * The secured tier: a Temporal server reachable only through a TLS frontend (nginx before a dev
 * server, test/support/secured-temporal.ts), configured by TEMPORAL_* variables alone, as a user
 * points prime-rl at Temporal Cloud or a secured cluster. Through the mTLS frontend and through the
 * API-key frontend a run completes (the launcher, its workers and their activities all connect
 * through it; no dev server is started); without the client certificate, or without the right API
 * key, the command fails at once (exit 2) saying TLS or authentication, before it starts anything.
 *
 * Needs nginx and openssl (scripts/setup.sh --tests installs nginx): skipped elsewhere, saying so.
 */
import * as path from 'node:path';
import { RunLayout } from '../lib/runfolder/layout';
import { runningDevServer } from '../lib/temporal/devserver';
import type { CliLaunch } from './support/processes';
import { chaosScene, checkRun, tinyRunArgs } from './support/rl-chaos';
import { securedTierUnusable, startSecuredTemporal, type SecuredTemporal } from './support/secured-temporal';

jest.setTimeout(5 * 60_000);

const unusable = securedTierUnusable();
if (unusable) console.warn(`test/temporal.secured.test.ts skipped: ${unusable}`);
const API_KEY = 'prl-test-key-7f3c';
const { root, modelDir, outputDir, cli } = chaosScene('prime-secured-');
let secured: SecuredTemporal | undefined;
beforeAll(async () => {
  if (!unusable) secured = await startSecuredTemporal(path.join(root, 'frontend'), API_KEY);
});
afterAll(() => secured?.close());

/** `prime-rl <args>` with only these TEMPORAL_* variables added to the environment. */
const prime = (args: string[], env: Record<string, string>): CliLaunch =>
  cli.start(args, ['env', ...Object.entries(env).map(([k, v]) => `${k}=${v}`)]);

async function exits(launch: CliLaunch): Promise<{ code: number | string; output: string }> {
  const code = await launch.exited;
  return { code, output: launch.output() };
}

/** A two-step rl run named `name` through the frontend that `env` reaches. */
async function runThrough(name: string, env: Record<string, string>): Promise<void> {
  const run = await exits(prime(['rl', ...(await tinyRunArgs({ name, modelDir, outputDir, steps: 2 }))], env));
  expect(run).toMatchObject({ code: 0 });
  expect(run.output).toContain(`run ${name} completed: 2 steps`);
  expect(run.output).toMatch(
    /Temporal at 127\.0\.0\.1:\d+ \(namespace default, (mTLS|TLS, API key); from TEMPORAL_ADDRESS\)/,
  );
  // The configured server was used: nothing started a dev server.
  expect(run.output).not.toContain('Temporal dev server on');
  expect(runningDevServer(outputDir)).toBeUndefined();
  checkRun(RunLayout.of(outputDir, name), 2);
}

(unusable ? test.skip : test)(
  'mTLS: without the client certificate a command fails at once saying TLS; with it a run completes',
  async () => {
    const env = secured!.mtlsEnv;
    const { TEMPORAL_TLS_CLIENT_CERT_PATH: _cert, TEMPORAL_TLS_CLIENT_KEY_PATH: _key, ...noCert } = env;
    const status = await exits(prime(['temporal', 'status'], noCert));
    expect(status.code).toBe(2);
    expect(status.output).toMatch(
      /TLS: the server refused a client without a certificate \(mTLS\): set TEMPORAL_TLS_CLIENT_CERT_PATH/,
    );
    const rl = await exits(
      prime(['rl', ...(await tinyRunArgs({ name: 'mtls-refused', modelDir, outputDir, steps: 2 }))], noCert),
    );
    expect(rl.code).toBe(2);
    expect(rl.output).toMatch(/TLS: the server refused a client without a certificate/);
    expect(rl.output).not.toMatch(/worker|inference/); // refused before any process started

    expect(await exits(prime(['temporal', 'status'], env))).toMatchObject({
      code: 0,
      output: expect.stringMatching(/reachable at 127\.0\.0\.1:\d+ \(namespace default, mTLS; from TEMPORAL_ADDRESS\)/),
    });
    await runThrough('mtls', env);
  },
);

(unusable ? test.skip : test)(
  'API key: without it, or with a wrong one, a command fails at once saying authentication; with it a run completes',
  async () => {
    const env = secured!.apiKeyEnv;
    const { TEMPORAL_API_KEY: _key, ...noKey } = env;
    // No key: TLS only (TEMPORAL_TLS), as a client of Temporal Cloud without its key.
    const none = await exits(prime(['temporal', 'status'], { ...noKey, TEMPORAL_TLS: 'true' }));
    expect(none.code).toBe(2);
    expect(none.output).toMatch(/authentication failed \(no API key is configured\): set TEMPORAL_API_KEY/);
    const wrong = await exits(prime(['runs', 'list'], { ...env, TEMPORAL_API_KEY: 'not-the-key' }));
    expect(wrong.code).toBe(2);
    expect(wrong.output).toMatch(/authentication failed \(the API key was refused\)/);
    expect(wrong.output).not.toContain('not-the-key');
    await runThrough('apikey', env);
  },
);
