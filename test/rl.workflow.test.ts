/**
 * The rl workflow end to end on a tiny model: a real Temporal dev server, real cpu and trainer
 * workers (in this process), a real inference server, real environments.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { loadConfig } from '../lib/config/loader';
import { RL_SECTIONS, RL_SHARED_KEYS, rlSchema, type RLConfig } from '../lib/config/schemas';
import type { EnvPool } from '../lib/envs/pool';
import type { InferenceServer } from '../lib/inference/server';
import { readEvalResults } from '../lib/eval';
import { createModel } from '../lib/model/create';
import { RunLayout } from '../lib/run/layout';
import { readStepMetrics } from '../lib/run/metrics';
import type { TemporalEndpoint } from '../lib/temporal/devserver';
import type { RLResult } from '../workflows/rl';
import { execute, startStack, type Stack } from './harness';


const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-rl-wf-'));
const modelDir = path.join(root, 'model');
let temporal: TemporalEndpoint;
let inference: InferenceServer;
let pool: EnvPool;
let stack: Stack;

function config(runName: string, asyncLevel: number, port: number): RLConfig {
  return loadConfig({
    schema: rlSchema,
    argv: [
      '--run-name', runName, '--model.name', modelDir, '--output-dir', path.join(root, 'outputs'),
      '--seq-len', '128', '--max-steps', '3', '--async-level', String(asyncLevel),
      '--env', '[{"id": "reverse-text"}]', '--ckpt.interval', '2',
      '--orchestrator.batch-size', '8', '--orchestrator.rollouts-per-example', '4', '--orchestrator.sampling.max-tokens', '12',
      '--orchestrator.base-urls', `http://127.0.0.1:${port}/v1`, '--trainer.optim.lr', '1e-3', '--trainer.threads', '1',
      '--eval.interval', '2', '--eval.num-examples', '2', '--eval.sampling.max-tokens', '12',
    ],
    env: {},
    shared: { keys: RL_SHARED_KEYS, sections: RL_SECTIONS },
  }).config;
}

beforeAll(async () => {
  createModel({ arch: 'qwen3', preset: 'tiny', tokenizer: 'bytes', seed: 0, out: modelDir });
  ({ temporal, inference, pool } = stack = await startStack(root, { modelDir, seqLen: 128 }));
});
afterAll(async () => {
  await stack?.close();
  fs.rmSync(root, { recursive: true, force: true });
});

test.each([0, 1])('a 3-step run with async_level %i trains every step once and records its metrics', async (asyncLevel) => {
  const port = Number(new URL(inference.url).port);
  const cfg = config(`run-async-${asyncLevel}`, asyncLevel, port);
  const result = await execute<RLResult>({
    temporal, pool, taskQueue: cfg.temporal.task_queue, workflowType: 'rl', workflowId: cfg.run_name, args: [cfg], trainer: true,
  });

  const layout = RunLayout.of(cfg.output_dir, cfg.run_name);
  expect(result.steps).toBe(3);
  expect(result.runDir).toBe(layout.dir);
  const lines = readStepMetrics(layout.metricsFile);
  expect(lines.map((l) => l.step)).toEqual([0, 1, 2]);
  // Rollouts of step n used policy version n - async_level (0 before that exists).
  expect(lines.map((l) => l.policy_version)).toEqual([0, 1, 2].map((s) => Math.max(0, s - asyncLevel)));
  for (const l of lines) expect(Number.isFinite(l.loss as number)).toBe(true);
  expect(fs.existsSync(path.join(layout.weightsDir(3), 'model.safetensors'))).toBe(true);
  expect(fs.existsSync(layout.checkpointDir(2))).toBe(true);
  expect(fs.existsSync(layout.checkpointDir(3))).toBe(true);
  const progress = (lines[2].progress as { steps: number; samples: number }).steps;
  expect(progress).toBe(3);
  // eval child workflows: the base model, every eval.interval versions, and the last one.
  expect(readEvalResults(layout.dir).map((r) => r.model)).toEqual(['base', 'step_2', 'step_3']);
});
