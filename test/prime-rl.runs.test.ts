/**
 * A prime-rl user's own files, run as they are: a Hugging Face cache made here holds one of our
 * tiny models as `PrimeIntellect/Qwen3-0.6B` and an SFT dataset as parquet as
 * `willcb/R1-reverse-wikipedia-paragraphs-v1-1000` (HF_HUB_CACHE points at it). An SFT run by those
 * names (test/fixtures/prime-rl/sft.toml) evaluates a verifiers taskset named by id every two
 * steps; then an RL run in prime-rl's shape trains on that taskset (`reverse-chat`, two turns a
 * rollout, its agent called `player`) with a renderer named. Real Temporal, engine, HTTP, and the
 * verifiers env server from .venv-verifiers (skipped, saying why, without it).
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { readRollouts } from '../lib/runfolder/rollouts';
import { runVerifiersRollout } from '../lib/orchestrator/verifiers-rollout';
import { cliCommands, type CommandTable } from '../lib/cli/main';
import type { Command } from '../lib/cli/command';
import { loadConfig } from '../lib/config/loader';
import type { RLConfig, SFTConfig } from '../lib/config/schemas';
import { readEvalResults } from '../lib/eval';
import { loadEnvironment } from '../lib/envs/loader';
import { EnvPool } from '../lib/envs/pool';
import { Failure, isBadInput } from '../lib/failures';
import type { InferenceServer } from '../lib/inference/server';
import { createModel } from '../lib/model/create';
import { projectRoot } from '../lib/paths';
import { RunLayout } from '../lib/runfolder/layout';
import { readStepMetrics } from '../lib/runfolder/metrics';
import type { SftResult } from '../workflows/sft';
import { executeRl, executeRun, type Stack, startStack } from './support/harness';
import { addToHubCache, conversationsParquet, folderFiles } from './support/hub-cache';
import { verifiersSuite } from './support/setup';

const suite = verifiersSuite('prime-rl.runs.test.ts');

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-prl-runs-'));
const hub = path.join(root, 'hub');
const MODEL = 'PrimeIntellect/Qwen3-0.6B';
const DATASET = 'willcb/R1-reverse-wikipedia-paragraphs-v1-1000';
const TASKSETS = path.join(projectRoot, 'test', 'fixtures', 'verifiers');
const commands: CommandTable = cliCommands({} as Command);
const saved = { HF_HUB_CACHE: process.env.HF_HUB_CACHE, PYTHONPATH: process.env.PYTHONPATH };
let stack: Stack & { inference: InferenceServer };

/** A command's config from a file, as the CLI loads it, with this test's stack on top. */
function load<T>(name: 'rl' | 'sft', file: string, argv: string[]): T {
  const cmd = commands[name] as Command;
  return loadConfig({
    schema: cmd.schema,
    argv: ['@', file, ...argv],
    env: {},
    shared: cmd.shared,
    aliases: cmd.aliases?.flat(),
  }).config as T;
}

/** Rows as the reverse-text dataset has them: prompt and completion message lists. */
function reversals(n: number) {
  const system = 'Reverse the text character-by-character. Put your answer in <reversed_text> tags.';
  return Array.from({ length: n }, (_, i) => {
    const word = 'abcdefghij'.slice(i % 5, (i % 5) + 3 + (i % 3));
    return {
      prompt: [
        { role: 'system', content: system },
        { role: 'user', content: word },
      ],
      completion: [
        { role: 'assistant', content: `<reversed_text>\n${[...word].reverse().join('')}\n</reversed_text>` },
      ],
    };
  });
}

suite('prime-rl files, run as they are', () => {
  beforeAll(async () => {
    const made = path.join(root, 'made');
    createModel({ arch: 'qwen3', preset: 'tiny', tokenizer: 'qwen3', seed: 0, out: made });
    addToHubCache(hub, 'model', MODEL, folderFiles(made));
    addToHubCache(hub, 'dataset', DATASET, {
      'README.md': '---\nlicense: mit\n---\n',
      'data/train-00000-of-00001.parquet': conversationsParquet(reversals(24)),
    });
    fs.rmSync(made, { recursive: true });
    // What `hf download` would have left, and the taskset package installed (here: on the path).
    process.env.HF_HUB_CACHE = hub;
    process.env.PYTHONPATH = [TASKSETS, saved.PYTHONPATH].filter(Boolean).join(':');
    stack = await startStack(root, { modelDir: MODEL, seqLen: 256 });
    // Listing a taskset starts Python (imports verifiers): slower than the stack's default on a busy machine.
    await stack.pool.close();
    stack.pool = new EnvPool({ workers: 1, timeoutS: 120 });
  }, 180_000);
  afterAll(async () => {
    await stack?.close();
    for (const [k, v] of Object.entries(saved))
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    fs.rmSync(root, { recursive: true, force: true });
  });

  test('a taskset that is not installed is named, with how to install it into .venv-verifiers (bad input: exit 2)', () => {
    expect(() => loadEnvironment('verifiers:owner/reverse-text@0.1', {})).toThrow(
      /taskset 'owner\/reverse-text@0\.1' is not installed in .*\.venv-verifiers: verifiers imports it as 'verifiers\.v1\.tasksets\.reverse_text' or 'reverse_text'.*\.venv-verifiers\/bin\/pip install/s,
    );
    expect(isBadInput(Failure.InvalidEnvironment)).toBe(true);
  });

  test('sft.toml by hub names: parquet data from the cache, the taskset evaluated every 2 steps into eval/ and the metrics', async () => {
    const cfg = load<SFTConfig>('sft', path.join(projectRoot, 'test', 'fixtures', 'prime-rl', 'sft.toml'), [
      ...['--run-name', 'prl-sft', '--output-dir', path.join(root, 'outputs'), '--threads', '1'],
      ...['--inference.server.port', String(new URL(stack.inference.url).port)],
    ]);
    const result = await executeRun<SftResult>(stack, 'sft', cfg);
    expect(result.steps).toBe(4);
    const layout = RunLayout.of(cfg.output_dir, cfg.run_name);
    const evals = readEvalResults(layout.dir);
    expect(evals.map((e) => e.model)).toEqual(['base', 'step_2', 'step_4']);
    for (const e of evals) {
      const m = e.environments['verifiers:reverse-chat'];
      expect(m).toMatchObject({ num_examples: 2, rollouts_per_example: 1 });
      expect(m.avg_at_k).toBeGreaterThanOrEqual(0);
    }
    const lines = readStepMetrics(layout.metricsFile);
    expect(lines.map((l) => l.step)).toEqual([0, 1, 2, 3]);
    for (const l of lines) expect(Number.isFinite(l.loss as number)).toBe(true);
    const evalKey = 'eval/verifiers:reverse-chat/avg@1';
    expect(lines.filter((l) => evalKey in l).map((l) => [l.step, l[evalKey]])).toEqual([
      [1, evals[1].environments['verifiers:reverse-chat'].avg_at_k],
      [3, evals[2].environments['verifiers:reverse-chat'].avg_at_k],
    ]);
    // The data came from the parquet file: 4 steps of 4 of its 24 rows.
    expect(fs.existsSync(layout.batchFile(3))).toBe(true);
  });

  /** prime-rl's reverse-text rl.toml, shrunk, on the reverse-chat taskset (agent `player`), with `flags` on top. */
  function rlConfig(runName: string, flags: string[]): RLConfig {
    const file = path.join(root, 'rl.toml');
    fs.writeFileSync(
      file,
      [
        'max_steps = 2\nseq_len = 256\n',
        `[model]\nname = "${MODEL}"\n`,
        '[orchestrator]\nbatch_size = 4\ngroup_size = 2\n',
        '[orchestrator.train.sampling]\nmax_completion_tokens = 12\n',
        '[[orchestrator.train.source]]\nname = "reverse-chat"\n',
        '[orchestrator.train.source.env.taskset]\nid = "reverse-chat"\nsize = 8\n',
        '[orchestrator.train.source.env.player.harness]\nid = "reverse-chat"\n',
        '[orchestrator.train.source.env.player.runtime]\ntype = "subprocess"\n',
        '[trainer.optim]\nlr = 3e-6\n',
        '[ckpt]\n[inference]\n',
        '[orchestrator.renderer]\nname = "prime-qwen3"\n',
      ].join('\n'),
    );
    return load<RLConfig>('rl', file, [
      ...['--run-name', runName, '--output-dir', path.join(root, 'outputs')],
      ...['--orchestrator.base-urls', `${stack.inference.url}/v1`, '--trainer.threads', '1'],
      ...['--orchestrator.filter-zero-advantages', 'false', ...flags],
    ]);
  }

  test('rl in prime-rl shape by hub names: a verifiers taskset by id, its agent `player`, a renderer named; two turns a rollout', async () => {
    const cfg = rlConfig('prl-rl', ['--async-level', '0']);
    expect(cfg.env[0].id).toBe('verifiers:reverse-chat');
    expect(cfg.orchestrator.renderer).toEqual({ name: 'prime-qwen3' });
    const result = await executeRl(stack, cfg);
    expect(result.steps).toBe(2);
    const layout = RunLayout.of(cfg.output_dir, cfg.run_name);
    const rollouts = readRollouts(layout.rolloutsDir(0));
    expect(rollouts).toHaveLength(4);
    for (const r of rollouts) {
      expect(r.error).toBeUndefined();
      expect(r.env).toBe('verifiers:reverse-chat');
      expect(r.metrics).toHaveProperty('lcs');
      // Two model turns: the player answered, was asked again, answered again.
      expect(r.turns).toBe(2);
      const sampled = r.samples.flat().filter((s) => s.generated);
      expect(sampled.length).toBeGreaterThanOrEqual(2);
    }
    expect(readStepMetrics(layout.metricsFile).map((l) => l.step)).toEqual([0, 1]);

    // The renderer named is the one the env server renders with: one it does not have errors the rollout, naming it.
    const env = cfg.env[0];
    const example = await stack.pool.example(env, 'train', 0, 0);
    if (!example.ok) throw new Error(example.error);
    const info = await stack.pool.info(env);
    if (!info.ok) throw new Error(info.error);
    const bad = await runVerifiersRollout(
      { env, info: info.value, example: example.value, seed: 1, seqLen: 256, sampling: cfg.orchestrator.sampling },
      stack.pool.verifiers,
      { baseUrl: `${stack.inference.url}/v1`, model: MODEL, renderer: { name: 'no-such-renderer' }, policyVersion: 0 },
    );
    expect(bad.error).toMatch(/no-such-renderer/);
  });

  test('in-flight mode: multi-turn verifiers rollouts, every sampled token with the version the server recorded', async () => {
    const cfg = rlConfig('prl-inflight', ['--orchestrator.in-flight.enabled', 'true', '--async-level', '1']);
    const result = await executeRl(stack, cfg);
    expect(result.steps).toBe(2);
    const layout = RunLayout.of(cfg.output_dir, cfg.run_name);
    for (const step of [0, 1]) {
      const rollouts = readRollouts(layout.rolloutsDir(step));
      expect(rollouts).toHaveLength(4);
      for (const r of rollouts) {
        expect(r.error).toBeUndefined();
        expect(r.turns).toBe(2);
        const sampled = r.samples.flat().filter((g) => g.generated);
        for (const g of sampled) {
          const versions = Array.from(g.versions ?? []);
          expect(versions).toHaveLength(Array.from(g.tokens).length);
          for (const v of versions) expect(v).toBeGreaterThanOrEqual(r.policyVersion);
          for (const v of versions) expect(v).toBeLessThanOrEqual(r.newestPolicyVersion!);
        }
        // Within the off-policy bound of the step that trained it.
        expect(step - r.policyVersion).toBeLessThanOrEqual(cfg.orchestrator.in_flight.max_off_policy_steps);
      }
    }
  });
});
