/** [wandb]: step metrics to Weights & Biases with the official SDK (the Python sidecar in .venv). */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { appendStepMetrics, withDocumentedNames } from '../lib/run/metrics';
import { startWandb } from '../lib/run/wandb';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-wandb-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const settings = { project: 'prime-rl-test', name: 'doc-run' };

test('without WANDB_API_KEY it says once why W&B logging is off, and goes on', async () => {
  const said: string[] = [];
  const logger = await startWandb({
    settings,
    runName: 'r',
    runDir: path.join(dir, 'nokey'),
    metricsFile: path.join(dir, 'nokey', 'metrics.jsonl'),
    config: {},
    say: (l) => said.push(l),
    env: { PATH: process.env.PATH },
  });
  expect(logger).toBeUndefined();
  expect(said).toEqual([
    expect.stringMatching(/^W&B logging is off: WANDB_API_KEY is not set .*the run goes on without it$/),
  ]);
});

test('no [wandb] project: nothing to say, nothing started', async () => {
  const said: string[] = [];
  expect(
    await startWandb({
      settings: {},
      runName: 'r',
      runDir: dir,
      metricsFile: path.join(dir, 'none.jsonl'),
      config: {},
      say: (l) => said.push(l),
      env: {},
    }),
  ).toBeUndefined();
  expect(said).toEqual([]);
});

test('WANDB_MODE=offline writes the steps, documented names included, to a local W&B run folder', async () => {
  const runDir = path.join(dir, 'offline');
  fs.mkdirSync(runDir, { recursive: true });
  const metricsFile = path.join(runDir, 'metrics.jsonl');
  const record = (step: number) =>
    withDocumentedNames({
      step,
      reward_mean: 0.1 * step,
      loss: 1 / (step + 1),
      lr: 1e-5,
      mismatch_kl: 0.001,
      kl_divergence: 0.002,
      kl_beta: 0.1,
      completion_tokens: 40,
      rollouts: 8,
      generate_seconds: 2,
      time: { train_end: 5 },
    });
  appendStepMetrics(metricsFile, record(0));
  const said: string[] = [];
  const logger = await startWandb({
    settings,
    runName: 'doc',
    runDir,
    metricsFile,
    config: { max_steps: 2 },
    say: (l) => said.push(l),
    pollMs: 50,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, WANDB_MODE: 'offline' },
  });
  expect(logger).toBeDefined();
  appendStepMetrics(metricsFile, record(1));
  await logger!.close();
  expect(said).toEqual([expect.stringMatching(/^W&B logging to .*offline/)]);
  const runs = fs.readdirSync(path.join(runDir, 'wandb')).filter((n) => n.startsWith('offline-run-'));
  expect(runs).toHaveLength(1);
  const files = fs.readdirSync(path.join(runDir, 'wandb', runs[0]));
  const log = files.find((f) => f.endsWith('.wandb'));
  expect(log).toBeDefined();
  // The run's record holds the history rows: our names and the documented ones, both steps.
  const bytes = fs.readFileSync(path.join(runDir, 'wandb', runs[0], log!)).toString('latin1');
  for (const name of [
    'train/reward',
    'train/loss',
    'train/learning_rate',
    'train/kl_divergence',
    'rollout/mean_length',
    'rollout/generation_time',
    'reward_mean',
    'time/train_end',
  ]) {
    expect(bytes).toContain(name);
  }
  expect(record(1)['rollout/mean_length']).toBe(5);
}, 120_000);
