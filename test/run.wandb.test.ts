/** [wandb]: step metrics to Weights & Biases with the official SDK (the Python sidecar in .venv). */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { cliCommands, type CommandTable } from '../lib/cli/main';
import type { Command } from '../lib/cli/command';
import { ConfigError } from '../lib/failures';
import { loadConfig } from '../lib/config/loader';
import type { RLConfig } from '../lib/config/schemas';
import { appendStepMetrics, withDocumentedNames } from '../lib/runfolder/metrics';
import { startWandb, type WandbSettings } from '../lib/run-ops/wandb';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-wandb-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

/** A command's config from a TOML text, loaded as the CLI loads it. */
const commands: CommandTable = cliCommands({} as Command);
function load(name: 'rl' | 'sft' | 'eval', toml: string): unknown {
  const file = path.join(dir, `${name}-${Math.random().toString(36).slice(2)}.toml`);
  fs.writeFileSync(file, toml);
  const cmd = commands[name] as Command;
  return loadConfig({
    schema: cmd.schema,
    argv: ['@', file],
    env: {},
    shared: cmd.shared,
    aliases: cmd.aliases?.flat(),
  }).config;
}
const wandbOf = (toml: string) => (load('rl', `model = "m"\n${toml}`) as RLConfig).wandb;

const settings: WandbSettings = { project: 'prime-rl-test', name: 'doc-run' };

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

test.each([
  ['WANDB_MODE=disabled', { WANDB_MODE: 'disabled' }, /^W&B logging is off: WANDB_MODE=disabled; /],
  // A sidecar that cannot start: one that answers with something else, one that exits silently.
  [
    'a sidecar that replies with no JSON',
    { WANDB_MODE: 'offline', PRIME_WANDB_PYTHON: '/bin/echo' },
    /^W&B logging is off: the sidecar replied '.*sidecar\.py', not its JSON line; /,
  ],
  [
    'a sidecar that exits at once',
    { WANDB_MODE: 'offline', PRIME_WANDB_PYTHON: '/bin/false' },
    /^W&B logging is off: the sidecar exited; /,
  ],
])('%s: says once why W&B logging is off, and goes on', async (_, env, said) => {
  const lines: string[] = [];
  const logger = await startWandb({
    settings,
    runName: 'r',
    runDir: path.join(dir, 'off'),
    metricsFile: path.join(dir, 'off', 'metrics.jsonl'),
    config: {},
    say: (l) => lines.push(l),
    env: { PATH: process.env.PATH, ...env },
  });
  expect(logger).toBeUndefined();
  expect(lines).toEqual([expect.stringMatching(said)]);
});

test('[wandb] turns W&B on: its project defaults to prime-rl, as in prime-rl; no [wandb] = off', () => {
  expect(wandbOf('[wandb]\nname = "my-run"\n')).toEqual({ project: 'prime-rl', name: 'my-run' });
  expect(wandbOf('[wandb]\n')).toEqual({ project: 'prime-rl' });
  expect(wandbOf('[wandb]\nproject = "mine"\n')).toEqual({ project: 'mine' });
  expect(wandbOf('max_steps = 1\n')).toBeUndefined(); // no followWandb activity then (activities/wandb.ts)
});

test.each(['sft', 'eval'] as const)('%s refuses a [wandb] section, naming it (only rl logs to W&B)', (name) => {
  expect(() => load(name, '[wandb]\nname = "x"\n')).toThrow(ConfigError);
  expect(() => load(name, '[wandb]\nname = "x"\n')).toThrow(/unknown config key 'wandb'/);
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
    settings: wandbOf('[wandb]\nname = "doc-run"\n')!, // project: the default, prime-rl
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
  // ...and names the project (a protobuf string: its length, 8, then the bytes).
  expect(bytes).toContain('\x08prime-rl');
  expect(record(1)['rollout/mean_length']).toBe(5);
}, 120_000);
