/**
 * The Python prime-rl's documented config (configs/prime-rl/documented.toml) runs end to end on a
 * tiny model: the file as it is, with flags only for the size of the run and this test's stack
 * (its difficulty filter then drops every group of the random model); and with the filter's bounds
 * widened by flags, so that the trainer steps.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { RL_ALIASES } from '../lib/config/aliases';
import { loadConfig } from '../lib/config/loader';
import { RL_SECTIONS, RL_SHARED_KEYS, rlSchema } from '../lib/config/schemas';
import { RunLayout } from '../lib/runfolder/layout';
import { DOCUMENTED_METRICS, readStepMetrics } from '../lib/runfolder/metrics';
import { closeStack, executeRl, type Stack, startStack } from './support/harness';
import { tinyModel } from './support/setup';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-rl-doc-'));
const modelDir = path.join(root, 'outputs', 'models', 'x');
let stack: Stack & { inference: { url: string } };

beforeAll(async () => {
  tinyModel(modelDir);
  stack = await startStack(root, { modelDir, seqLen: 128 });
});
afterAll(() => closeStack(stack, root));

const documented = fs.readFileSync(path.join(__dirname, '..', 'configs', 'prime-rl', 'documented.toml'), 'utf8');

/** The documented file, with flags only for the size of the run and this test's stack, then `extra`. */
function documentedConfig(runName: string, extra: string[]) {
  const file = path.join(root, 'documented.toml');
  fs.writeFileSync(file, documented);
  return loadConfig({
    schema: rlSchema,
    // The file's model = "outputs/models/x" is relative to where a user runs it: here, `root`.
    argv: [
      '--model',
      modelDir,
      '@',
      file,
      '--run-name',
      runName,
      '--max-steps',
      '2',
      '--batch-size',
      '8',
      '--rollouts-per-example',
      '4',
      '--sampling.max-tokens',
      '12',
      '--seq-len',
      '128',
      '--output-dir',
      path.join(root, 'outputs'),
      '--orchestrator.base-urls',
      `${stack.inference.url}/v1`,
      '--trainer.threads',
      '1',
      ...extra,
    ],
    env: {},
    cwd: root,
    shared: { keys: RL_SHARED_KEYS, sections: RL_SECTIONS },
    aliases: RL_ALIASES,
  }).config;
}

test("the documented filter as it is: a random model's groups are all dropped, refilled up to max_refill_rounds, and counted", async () => {
  const cfg = documentedConfig('documented-filter', []);
  expect(cfg.orchestrator.difficulty_filter).toEqual({
    enabled: true,
    min_reward_variance: 0.1,
    max_reward: 0.95,
    min_reward: 0.05,
  });
  const result = await executeRl(stack, cfg, { workflowId: 'documented-filter' });
  expect(result.steps).toBe(2);
  const lines = readStepMetrics(RunLayout.of(cfg.output_dir, cfg.run_name).metricsFile);
  const rounds = cfg.orchestrator.max_refill_rounds;
  for (const l of lines) {
    // 2 groups a step, none with a reward variance of 0.1: every group the filter judges is
    // dropped, and refilled until max_refill_rounds; the step trains on nothing. (A group with fewer
    // than 2 valid rollouts, e.g. errored ones, is not the filter's to judge: packing drops it.)
    const kept = 2 - (l.groups_missing as number);
    expect(l).toMatchObject({ samples: 0, groups_too_few_valid: kept });
    if (kept < 2) expect(l.refill_rounds).toBe(rounds);
    expect(l.groups_dropped as number).toBeGreaterThan(0);
    expect(l.dropped_by).toEqual({ 'difficulty/reward_variance': l.groups_dropped });
    expect(l.rollouts).toBe(4 * ((l.groups_dropped as number) + kept));
  }
}, 300_000);

test('the documented config trains a few steps and records the documented metric names', async () => {
  const cfg = documentedConfig('documented', [
    // A random model scores (near) 0 everywhere (the test above): the difficulty filter stays on,
    // with bounds that keep those groups, and zero-advantage rollouts are trained on, so that the
    // trainer steps.
    '--orchestrator.difficulty-filter.min-reward-variance',
    '0',
    '--orchestrator.difficulty-filter.min-reward',
    '0',
    '--no-orchestrator.filter-zero-advantages',
  ]);
  const result = await executeRl(stack, cfg, {
    workflowId: 'documented',
  });
  expect(result.steps).toBe(2);
  expect(cfg.trainer.lora).toMatchObject({ enabled: true, rank: 64 });
  expect(cfg.orchestrator.difficulty_filter).toMatchObject({ enabled: true, max_reward: 0.95 });
  expect(cfg.trainer.kl_penalty).toEqual({ enabled: true, target_kl: 0.01, beta: 0.1 });
  const lines = readStepMetrics(RunLayout.of(cfg.output_dir, cfg.run_name).metricsFile);
  expect(lines.map((l) => l.step)).toEqual([0, 1]);
  for (const l of lines) {
    for (const name of Object.keys(DOCUMENTED_METRICS)) expect(Number.isFinite(l[name] as number)).toBe(true);
    expect(l['train/reward']).toBe(l.reward_mean);
    expect(l['train/learning_rate']).toBe(l.lr);
  }
  // LoRA with its rank from `r`: the adapters are saved in PEFT layout.
  expect(fs.existsSync(path.join(RunLayout.of(cfg.output_dir, cfg.run_name).weightsDir(2), 'lora'))).toBe(true);
}, 300_000);
