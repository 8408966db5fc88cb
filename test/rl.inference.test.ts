/**
 * rl runs whose inference servers push back or refuse, and a trainer that diverges: a real Temporal
 * dev server, real cpu and trainer workers (in this process), real inference servers over HTTP.
 * A run either completes (a full queue, an API key) or fails at once with a non-retryable failure
 * that says why (a wrong key, a refused weight folder, non-finite weights); it never retries
 * forever. Each run is bounded by a workflow execution timeout, so a run that would retry forever
 * fails the test instead of hanging it.
 */
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { Client, Connection } from '@temporalio/client';
import { ApplicationFailure } from '@temporalio/common';
import type { RLConfig } from '../lib/config/schemas';
import { readEvalResults } from '../lib/eval';
import { Failure } from '../lib/failures';
import type { InferenceServer } from '../lib/inference/server';
import { freePort } from '../lib/net';
import { projectRoot } from '../lib/paths';
import { RunLayout } from '../lib/runfolder/layout';
import { readStepMetrics } from '../lib/runfolder/metrics';
import type { RLResult } from '../workflows/rl';
import { executeRl, startServer, startStack, type Stack } from './support/harness';
import { lowercaseEnv, rlConfig, serverRunArgs, smallStep, tinyModel } from './support/setup';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-rl-inference-'));
const modelDir = path.join(root, 'model');
const KEY_VAR = 'TEST_PRIME_RL_INFERENCE_KEY';
const WRONG_KEY_VAR = 'TEST_PRIME_RL_WRONG_KEY';
let stack: Stack;
const servers: InferenceServer[] = [];

beforeAll(async () => {
  tinyModel(modelDir);
  stack = await startStack(root);
  // The cpu worker runs in this process: the keys are read from its environment.
  process.env[KEY_VAR] = 'the-servers-key';
  process.env[WRONG_KEY_VAR] = 'not-the-key';
});
afterAll(async () => {
  for (const s of servers) await s.close(1000);
  await stack?.close();
  delete process.env[KEY_VAR];
  delete process.env[WRONG_KEY_VAR];
  fs.rmSync(root, { recursive: true, force: true });
});

async function server(settings: Record<string, unknown> = {}): Promise<string> {
  const s = await startServer(root, { modelDir, seqLen: 128, settings });
  servers.push(s);
  return `${s.url}/v1`;
}

/** A small run on the server at `baseUrl` (rewards vary, so every step trains); `args` add to or override it. */
function config(baseUrl: string, args: string[]): RLConfig {
  return rlConfig([
    ...serverRunArgs(modelDir, path.join(root, 'outputs'), baseUrl),
    '--env',
    lowercaseEnv,
    ...smallStep(8),
    '--trainer.optim.lr',
    '1e-3',
    ...args,
  ]);
}

/** Runs the workflow; a run that retries forever hits the execution timeout instead. */
function run(cfg: RLConfig): Promise<RLResult> {
  return executeRl(stack, cfg, {
    executionTimeout: '4 minutes',
  });
}

interface Shown {
  status: string;
  failure?: string;
  retrying?: { activity: string; attempt: number; last_failure?: string }[];
}

/**
 * `prime-rl runs show RUN` against the stack's Temporal server, parsed. Not spawnSync: its progress
 * query is answered by the workflow worker in this process.
 */
async function runsShow(run: string): Promise<Shown> {
  const { stdout } = await promisify(execFile)(
    process.execPath,
    [path.join(projectRoot, 'bin', 'prime-rl.js'), 'runs', 'show', run, '--temporal.address', stack.temporal.address],
    {
      cwd: projectRoot,
      env: { PATH: process.env.PATH },
      encoding: 'utf8',
    },
  );
  return JSON.parse(stdout) as Shown;
}

/** The activity's failure at the end of a failed run's cause chain. */
async function failureOf(result: Promise<unknown>): Promise<ApplicationFailure> {
  const e = await result.then(
    () => {
      throw new Error('the run completed, but it should have failed');
    },
    (err: unknown) => err,
  );
  let c: unknown = e;
  while (c instanceof Error && c.cause) c = c.cause;
  if (!(c instanceof ApplicationFailure)) throw new Error(`not an activity failure: ${String(c)} (from ${String(e)})`);
  return c;
}

test('a server with max_running 2 and max_queued 2 serves batches of 8: no 429 fails the run', async () => {
  const url = await server({ max_running: 2, max_queued: 2 });
  const cfg = config(url, [
    '--run-name',
    'small-queue',
    '--max-steps',
    '2',
    '--inference.max-running',
    '2',
    '--inference.max-queued',
    '2',
  ]);
  const result = await run(cfg);
  expect(result.steps).toBe(2);
  const lines = readStepMetrics(RunLayout.of(cfg.output_dir, cfg.run_name).metricsFile);
  expect(lines.map((l) => [l.rollouts, l.rollouts_errored])).toEqual([
    [8, 0],
    [8, 0],
  ]);
}, 300_000);

test('with inference.server.api_key_var set, rollouts and evals send the key and the run completes', async () => {
  const url = await server({ server: { api_key_var: KEY_VAR } });
  const cfg = config(url, [
    '--run-name',
    'with-key',
    '--max-steps',
    '2',
    '--inference.server.api-key-var',
    KEY_VAR,
    '--eval.interval',
    '2',
    '--eval.num-examples',
    '2',
    '--eval.sampling.max-tokens',
    '8',
  ]);
  const result = await run(cfg);
  expect(result.steps).toBe(2);
  const layout = RunLayout.of(cfg.output_dir, cfg.run_name);
  expect(readStepMetrics(layout.metricsFile).map((l) => l.rollouts_errored)).toEqual([0, 0]);
  expect(readEvalResults(layout.dir).map((r) => r.model)).toEqual(['base', 'step_2']);
}, 300_000);

test('a key the server does not accept (401) fails the run at once, naming the key variable', async () => {
  const url = await server({ server: { api_key_var: KEY_VAR } });
  const cfg = config(url, [
    '--run-name',
    'wrong-key',
    '--max-steps',
    '2',
    '--inference.server.api-key-var',
    WRONG_KEY_VAR,
  ]);
  const failure = await failureOf(run(cfg));
  expect(failure.type).toBe(Failure.InferenceRejected);
  expect(failure.nonRetryable).toBe(true);
  expect(failure.message).toMatch(
    /HTTP 401: .*environment variable TEST_PRIME_RL_WRONG_KEY, named by inference\.server\.api_key_var/,
  );
}, 300_000);

test("a server that refuses the run's weights (403) fails the run with its message; `runs show` prints it", async () => {
  const url = await server({ allowed_weight_roots: [path.join(root, 'elsewhere')] });
  const cfg = config(url, ['--run-name', 'forbidden-weights', '--max-steps', '3', '--async-level', '1']);
  // Step 2 samples from policy version 1: the first update_weights, refused.
  const failure = await failureOf(run(cfg));
  expect(failure.type).toBe(Failure.InferenceRejected);
  expect(failure.nonRetryable).toBe(true);
  expect(failure.message).toMatch(
    /\/update_weights: HTTP 403: weight_dir: .*forbidden-weights\/weights\/step_1 is outside the allowed roots/,
  );

  const shown = await runsShow(cfg.run_name);
  expect(shown.status).toBe('FAILED');
  expect(shown.failure).toMatch(
    /Activity task failed \(generateRollouts\): .*HTTP 403: weight_dir: .* is outside the allowed roots/,
  );
}, 300_000);

test('a train step whose weights are not finite fails the run non-retryably, naming the tensor, and publishes nothing', async () => {
  const url = await server();
  // lr 1e37: step 0 makes the weights huge (finite), step 1 NaN. With async_level 2 both steps
  // sample from the base model, so no server ever loads the huge weights.
  const cfg = config(url, [
    '--run-name',
    'diverges',
    '--max-steps',
    '2',
    '--async-level',
    '2',
    '--trainer.optim.lr',
    '1e37',
  ]);
  const failure = await failureOf(run(cfg));
  expect(failure.type).toBe(Failure.NonFiniteWeights);
  expect(failure.nonRetryable).toBe(true);
  expect(failure.message).toMatch(
    /^the run diverged \(step 1: loss .*\): tensor '[\w.]+' holds \d+ non-finite values \(NaN or Inf\) of \d+: weights\/step_2 not published/,
  );
  expect(fs.existsSync(RunLayout.of(cfg.output_dir, cfg.run_name).weightsDir(2))).toBe(false);
}, 300_000);

test('a run whose server is down keeps retrying (it may come back), and `runs show` says which activity and why', async () => {
  const cfg = config(`http://127.0.0.1:${await freePort()}/v1`, ['--run-name', 'server-down', '--max-steps', '1']);
  const result = run(cfg).catch((e: unknown) => e);
  // Polled until the workflow exists and its first retry shows (Temporal retries after 1 s);
  // bounded, never a hang.
  let shown: Shown | undefined;
  for (let i = 0; i < 120 && !shown?.retrying?.length; i++) {
    await new Promise((r) => setTimeout(r, 500));
    try {
      shown = await runsShow(cfg.run_name);
    } catch {
      // not started yet
    }
  }
  if (!shown) throw new Error('the run never showed');
  expect(shown.status).toBe('RUNNING');
  expect(shown.retrying?.[0]).toMatchObject({ activity: 'generateRollouts' });
  expect(shown.retrying![0].attempt).toBeGreaterThanOrEqual(2);
  expect(shown.retrying![0].last_failure).toMatch(/\/health unreachable/);
  const connection = await Connection.connect({ address: stack.temporal.address });
  try {
    await new Client({ connection }).workflow.getHandle(cfg.run_name).terminate('test done');
  } finally {
    await connection.close();
  }
  expect(await result).toBeInstanceOf(Error);
}, 300_000);
