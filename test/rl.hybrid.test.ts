/**
 * rl and its evals on a hybrid model end to end: a tiny Qwen3.5 (`model create --arch qwen3_5`:
 * the Hub's multimodal layout, three Gated DeltaNet blocks and one full-attention block, the byte
 * tokenizer) served by the real inference server (its generator's state slots beside the KV
 * blocks; a group's rollouts share their prompt's state), trained by real trainer workers, on a
 * real Temporal dev server. The weight updates between steps reach the server in flight. The model
 * is named as a user names the real one: `Qwen/Qwen3.5-0.8B`, from a local Hugging Face cache
 * (HF_HUB_CACHE) holding the tiny model under that name, as `hf download` would have left it.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { RLConfig } from '../lib/config/schemas';
import { readEvalResults } from '../lib/eval';
import { RunLayout } from '../lib/runfolder/layout';
import { readStepMetrics } from '../lib/runfolder/metrics';
import { closeStack, executeRl, type ServingStack, startStack } from './support/harness';
import {
  expectRewardGain,
  lowercaseRunArgs,
  rlConfig,
  serverRunArgs,
  smallStep,
  tempDir,
  tinyModel,
} from './support/setup';
import { addToHubCache, folderFiles } from './support/hub-cache';

const root = tempDir('prime-rl-hybrid-');
const MODEL = 'Qwen/Qwen3.5-0.8B';
const savedHub = process.env.HF_HUB_CACHE;
let stack: ServingStack;

const config = (args: string[]): RLConfig =>
  rlConfig([...serverRunArgs(MODEL, path.join(root, 'outputs'), `${stack.inference.url}/v1`), ...args]);

beforeAll(async () => {
  const made = tinyModel(path.join(root, 'made'), { arch: 'qwen3_5' });
  const hub = path.join(root, 'hub');
  addToHubCache(hub, 'model', MODEL, folderFiles(made));
  fs.rmSync(made, { recursive: true });
  process.env.HF_HUB_CACHE = hub;
  stack = await startStack(root, { modelDir: MODEL, seqLen: 128 });
});
afterAll(async () => {
  await closeStack(stack, root);
  if (savedHub === undefined) delete process.env.HF_HUB_CACHE;
  else process.env.HF_HUB_CACHE = savedHub;
});

test('a 3-step run (async_level 1) trains every step once; its evals score the base model and its steps', async () => {
  const cfg = config([
    '--run-name',
    'steps',
    '--max-steps',
    '3',
    '--async-level',
    '1',
    '--env',
    '[{"id": "reverse-text"}]',
    '--ckpt.interval',
    '100',
    ...smallStep(12),
    '--eval.interval',
    '2',
    '--eval.num-examples',
    '2',
    '--eval.sampling.max-tokens',
    '12',
  ]);
  const result = await executeRl(stack, cfg);
  expect(result.steps).toBe(3);
  const lines = readStepMetrics(RunLayout.of(cfg.output_dir, cfg.run_name).metricsFile);
  expect(lines.map((l) => l.step)).toEqual([0, 1, 2]);
  expect(lines.map((l) => l.policy_version)).toEqual([0, 0, 1]);
  for (const l of lines) expect(Number.isFinite(l.loss as number)).toBe(true);
  const evals = readEvalResults(result.runDir);
  expect(evals.map((r) => r.model)).toEqual(['base', 'step_2', 'step_3']);
  for (const r of evals) expect(Number.isFinite(r.environments['reverse-text'].avg_at_k)).toBe(true);
});

test('RL raises the reward: a random Qwen3.5 learns to write lowercase letters', async () => {
  const cfg = config(lowercaseRunArgs('learns'));
  await executeRl(stack, cfg);
  expectRewardGain(cfg);
});
