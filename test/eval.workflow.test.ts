/**
 * The eval workflow end to end: a real Temporal dev server, a cpu worker in this process, a real
 * inference server on a tiny model; the base model and two weight folders on a binary env
 * (arithmetic: pass@k) and a graded one, then the same server's OpenAI endpoint as an external API.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { evalSchema, type EvalConfig } from '../lib/config/schemas';
import { describeFailure } from '../lib/failures';
import { readEvalResults, renderEvalTable } from '../lib/eval';
import { createModel } from '../lib/model/create';
import type { EvalResult } from '../workflows/eval';
import { closeStack, executeRun, type ServingStack, startServer, startStack } from './support/harness';
import { cliConfig, fixtureEnv, tempDir, tinyModel } from './support/setup';

const root = tempDir('prime-rl-eval-');
const modelDir = path.join(root, 'model');
const weightsDir = path.join(root, 'outputs', 'trained', 'weights');
/** Graded rewards a random model already varies on (untrained models score 0 on the built-in envs). */
const LOWERCASE = fixtureEnv('lowercase.ts');
let stack: ServingStack;

function config(args: string[]): EvalConfig {
  return cliConfig(evalSchema, [
    '--output-dir',
    path.join(root, 'outputs'),
    '--seq-len',
    '256',
    '--num-examples',
    '4',
    '--rollouts-per-example',
    '2',
    '--sampling.max-tokens',
    '8',
    '--server.port',
    new URL(stack.inference.url).port,
    ...args,
  ]);
}

const run = (cfg: EvalConfig) =>
  executeRun<EvalResult>(stack, 'eval', cfg, { workflowId: `${cfg.run_name}-${Date.now()}`, args: [{ config: cfg }] });

beforeAll(async () => {
  tinyModel(modelDir);
  // Two "trained" versions: same architecture, other weights.
  for (const [step, seed] of [
    [10, 1],
    [20, 2],
  ])
    createModel({
      arch: 'qwen3',
      preset: 'tiny',
      tokenizer: 'bytes',
      seed,
      out: path.join(weightsDir, `step_${step}`),
    });
  stack = await startStack(root, { modelDir, seqLen: 256 });
});
afterAll(() => closeStack(stack, root));

test('base + two step folders on two environments: results files, pass@k for the binary env, a table', async () => {
  const cfg = config([
    '--run-name',
    'ev',
    '--model.name',
    modelDir,
    '--weights-dir',
    weightsDir,
    '--env',
    JSON.stringify([{ id: 'arithmetic' }, { id: LOWERCASE }]),
  ]);
  const { runDir, results } = await run(cfg);
  expect(results.map((r) => [r.model, r.step])).toEqual([
    ['base', null],
    ['step_10', 10],
    ['step_20', 20],
  ]);
  const stored = readEvalResults(runDir);
  expect(stored).toEqual(results);
  for (const r of stored) {
    expect(Object.keys(r.environments)).toEqual(['arithmetic', LOWERCASE]);
    const a = r.environments.arithmetic;
    expect(a).toMatchObject({ num_examples: 4, rollouts_per_example: 2 });
    expect(Object.keys(a.pass_at_k!)).toEqual(['1', '2']);
    // Binary rewards: pass@1 is the mean reward; pass@2 is at least that.
    expect(a.pass_at_k!['1']).toBeCloseTo(a.avg_at_k, 12);
    expect(a.pass_at_k!['2']).toBeGreaterThanOrEqual(a.pass_at_k!['1']);
    expect(a.completion_tokens_mean).toBeGreaterThan(0);
    // The lowercase fraction of a random model's bytes is graded, strictly inside (0, 1) on average
    // (no pass@k); the (population) variance of rewards in [0, 1] is at most mean x (1 - mean).
    const lc = r.environments[LOWERCASE];
    expect(lc).toMatchObject({ num_examples: 2, rollouts_per_example: 2, pass_at_k: null });
    expect(lc.avg_at_k).toBeGreaterThan(0);
    expect(lc.avg_at_k).toBeLessThan(1);
    expect(lc.reward_std).toBeGreaterThan(0);
    expect(lc.reward_std ** 2).toBeLessThanOrEqual(lc.avg_at_k * (1 - lc.avg_at_k) + 1e-12);
  }
  // The server served the last version evaluated.
  expect(
    ((await (await fetch(`${stack.inference.url}/health`)).json()) as { policy_version: number }).policy_version,
  ).toBe(20);
  const table = renderEvalTable(stored);
  expect(table.split('\n')[0]).toMatch(/^environment\s+model\s+k\s+avg@k\s+std\s+pass@1\s+pass@2\s+tokens$/);
  expect(table).toContain('step_20');

  // --steps picks folders; a missing one is a clear error.
  const picked = await run(
    config([
      '--run-name',
      'ev-pick',
      '--model.name',
      modelDir,
      '--weights-dir',
      weightsDir,
      '--steps',
      '[20]',
      '--no-eval-base',
      '--env',
      '[{"id": "arithmetic"}]',
    ]),
  );
  expect(picked.results.map((r) => r.model)).toEqual(['step_20']);
  const missing = await run(
    config([
      '--run-name',
      'ev-miss',
      '--model.name',
      modelDir,
      '--weights-dir',
      weightsDir,
      '--steps',
      '[30]',
      '--env',
      '[{"id": "arithmetic"}]',
    ]),
  ).catch((e: Error) => e);
  expect(missing).toBeInstanceOf(Error);
  // What the CLI prints (lib/failures.ts), and that it counts as bad input (exit 2).
  expect(describeFailure(missing as Error)).toEqual({
    message: `Workflow execution failed: Activity task failed (prepareEval): steps 30 not found in ${weightsDir} (it has 10, 20)`,
    badInput: true,
  });
});

test('an external OpenAI-compatible API (our own server standing in) is evaluated through chat completions', async () => {
  process.env.EVAL_TEST_KEY = 'unused-by-this-server';
  const cfg = config([
    '--run-name',
    'ev-api',
    '--model.name',
    modelDir,
    '--client.base-url',
    `${stack.inference.url}/v1`,
    '--client.api-key-var',
    'EVAL_TEST_KEY',
    '--env',
    '[{"id": "arithmetic"}]',
  ]);
  const { runDir, results } = await run(cfg);
  expect(results).toHaveLength(1);
  expect(results[0]).toMatchObject({ model: modelDir, step: null });
  const m = results[0].environments.arithmetic;
  expect(m.num_examples).toBe(4);
  expect(m.pass_at_k).not.toBeNull();
  expect(m.completion_tokens_mean).toBeGreaterThan(0);
  expect(fs.readdirSync(path.join(runDir, 'eval')).filter((f) => f.endsWith('.json'))).toHaveLength(1);
});

test('a local server with server.api_key_var: the eval sends the key', async () => {
  process.env.EVAL_SERVER_KEY = 'the-local-key';
  const keyed = await startServer(root, {
    modelDir,
    seqLen: 256,
    settings: { server: { api_key_var: 'EVAL_SERVER_KEY' } },
  });
  try {
    const cfg = config([
      '--run-name',
      'ev-key',
      '--model.name',
      modelDir,
      '--env',
      '[{"id": "arithmetic"}]',
      '--server.api-key-var',
      'EVAL_SERVER_KEY',
    ]);
    const { results } = await run({ ...cfg, server: { ...cfg.server, port: Number(new URL(keyed.url).port) } });
    expect(results.map((r) => r.model)).toEqual(['base']);
    expect(results[0].environments.arithmetic.num_examples).toBe(4);
  } finally {
    await keyed.close(1000);
    delete process.env.EVAL_SERVER_KEY;
  }
});
