/**
 * The set-up test files share: a temp folder per file, tiny models, configs of small runs and the
 * command-line options they have in common. The stack a workflow test runs on is in ./harness, the
 * processes a CLI test spawns in ./processes.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { z } from 'zod';
import { loadConfig } from '../../lib/config/loader';
import { RL_SECTIONS, RL_SHARED_KEYS, rlSchema, type RLConfig } from '../../lib/config/schemas';
import { VERIFIERS_VENV } from '../../lib/envs/verifiers/environment';
import { createModel } from '../../lib/model/create';
import { RunLayout } from '../../lib/runfolder/layout';
import { readStepMetrics } from '../../lib/runfolder/metrics';

/** A test environment under test/fixtures/envs, by file name. */
export const fixtureEnv = (file: string): string => path.join(__dirname, '..', 'fixtures', 'envs', file);

/** `--env` of the lowercase fixture: graded rewards a random model already varies on, so every step trains. */
export const lowercaseEnv = JSON.stringify([{ id: fixtureEnv('lowercase.ts') }]);

/** A fresh folder under the system temp folder; remove it with `removeDir` when the file is done. */
export const tempDir = (prefix: string): string => fs.mkdtempSync(path.join(os.tmpdir(), prefix));

export const removeDir = (dir: string): void => fs.rmSync(dir, { recursive: true, force: true });

/**
 * A temp folder removed after the test file, with `file` writing a file in it. For test files with
 * nothing else to close: Jest runs `afterAll` hooks in the order they were declared, so a stack
 * using the folder would still be running when it is removed.
 */
export function scratchDir(prefix: string): { dir: string; file(name: string, text: string): string } {
  const dir = tempDir(prefix);
  afterAll(() => removeDir(dir));
  return {
    dir,
    file(name, text) {
      const p = path.join(dir, name);
      fs.writeFileSync(p, text);
      return p;
    },
  };
}

/**
 * A tiny model in `out`, by default the dense qwen3 of most run, server and trainer tests (bytes
 * tokenizer, seed 0); `o` changes any of createModel's options. Returns `out`.
 */
export function tinyModel(out: string, o: Partial<Parameters<typeof createModel>[0]> = {}): string {
  createModel({ arch: 'qwen3', preset: 'tiny', tokenizer: 'bytes', seed: 0, out, ...o });
  return out;
}

/** The config under `schema` of a command line (no files, no environment variables), as the CLI loads it. */
export const cliConfig = <S extends z.ZodType>(schema: S, argv: string[]): z.output<S> =>
  loadConfig({ schema, argv, env: {} }).config;

/** The rl config of a command line (no files, no environment variables), as `prime-rl rl` loads it. */
export const rlConfig = (argv: string[]): RLConfig =>
  loadConfig({ schema: rlSchema, argv, env: {}, shared: { keys: RL_SHARED_KEYS, sections: RL_SECTIONS } }).config;

/**
 * An rl config as `temporal workflow start` passes it (no CLI, so no shared keys filled in): run
 * `name` of `model` on reverse-text under `outputDir`, with `orchestrator` keys on top.
 */
export const workflowRlConfig = (
  name: string,
  model: string,
  outputDir: string,
  orchestrator: Record<string, unknown> = {},
): RLConfig =>
  rlSchema.parse({
    run_name: name,
    model: { name: model },
    env: [{ id: 'reverse-text' }],
    output_dir: outputDir,
    trainer: { model: { name: model } },
    inference: { model: { name: model } },
    orchestrator: { model: { name: model }, ...orchestrator },
  });

/** A run of `model`, written under `outputDir`, in rows of 128 tokens. */
const modelRunArgs = (model: string, outputDir: string): string[] => [
  '--model.name',
  model,
  '--output-dir',
  outputDir,
  '--seq-len',
  '128',
];

/** Run `name` of `model`, written under `outputDir`, in rows of 128 tokens. */
export const namedRunArgs = (name: string, model: string, outputDir: string): string[] => [
  '--run-name',
  name,
  ...modelRunArgs(model, outputDir),
];

/** A run of `model` writing under `outputDir` and sampling from `baseUrl`: rows of 128 tokens, a trainer on one thread. */
export const serverRunArgs = (model: string, outputDir: string, baseUrl: string): string[] => [
  ...modelRunArgs(model, outputDir),
  '--orchestrator.base-urls',
  baseUrl,
  '--trainer.threads',
  '1',
];

/** A small step: 2 examples x 4 rollouts of at most `maxTokens` tokens each. */
export const smallStep = (maxTokens: number): string[] => [
  '--orchestrator.batch-size',
  '8',
  '--orchestrator.rollouts-per-example',
  '4',
  '--orchestrator.sampling.max-tokens',
  String(maxTokens),
];

/** SFT on reverse-text demonstrations: batches of `batch` samples from the first `examples` examples. */
export const reverseTextSft = (batch: number, examples: number): string[] => [
  '--batch-size',
  String(batch),
  '--data.env',
  '{"id": "reverse-text"}',
  '--data.num-examples',
  String(examples),
];

/** One env worker and one thread each for the trainer and inference of a run the CLI launches. */
export const oneThreadEach: readonly string[] = [
  '--orchestrator.env-workers',
  '1',
  '--trainer.threads',
  '1',
  '--inference.threads',
  '1',
];

/** RL on the lowercase task (`lowercaseEnv`): 15 steps of 32 rollouts (4 prompts x 8) of up to 8 tokens, lr 1e-2. */
export const lowercaseRunArgs = (runName: string): string[] => [
  '--run-name',
  runName,
  '--max-steps',
  '15',
  '--env',
  lowercaseEnv,
  '--ckpt.interval',
  '100',
  '--orchestrator.batch-size',
  '32',
  '--orchestrator.rollouts-per-example',
  '8',
  '--orchestrator.sampling.max-tokens',
  '8',
  '--trainer.optim.lr',
  '1e-2',
  '--trainer.optim.weight-decay',
  '0',
];

/** The run learnt: the mean reward of its first three steps below 0.3, of its last three 0.2 higher or more. */
export function expectRewardGain(cfg: RLConfig): void {
  const rewards = readStepMetrics(RunLayout.of(cfg.output_dir, cfg.run_name).metricsFile).map(
    (l) => l.reward_mean as number,
  );
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const first = mean(rewards.slice(0, 3)),
    last = mean(rewards.slice(-3));
  expect(first).toBeLessThan(0.3);
  expect(last).toBeGreaterThan(first + 0.2);
}

/** Checks the installed packages by their metadata: importing verifiers.v1 takes 5 CPU s here. */
const VERIFIERS_PROBE = [
  'import importlib.metadata as m, importlib.util as u, sys',
  'v = m.version("verifiers")',
  'sys.exit(f"verifiers {v} is installed, not 0.4.0") if v != "0.4.0" else None',
  'sys.exit("no module renderers") if u.find_spec("renderers") is None else None',
].join('\n');

/**
 * `describe` where a Python with verifiers 0.4.0 (its env server and renderers) is at `python`
 * (.venv-verifiers by default), else `describe.skip`, saying why and how to install it.
 */
export function verifiersSuite(file: string, python = path.join(VERIFIERS_VENV, 'bin', 'python')): jest.Describe {
  const probe = fs.existsSync(python) ? spawnSync(python, ['-c', VERIFIERS_PROBE], { encoding: 'utf8' }) : undefined;
  if (probe?.status === 0) return describe;
  console.warn(
    `${file} skipped: no Python with verifiers 0.4.0 at ${python} ` +
      `(${probe ? probe.stderr.trim().split('\n').pop() : 'not found'}); run bash scripts/setup.sh --verifiers`,
  );
  return describe.skip;
}
