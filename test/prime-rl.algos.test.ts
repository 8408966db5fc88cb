/**
 * prime-rl's algorithm, eval and SFT files run, not only resolved: tiny models in a Hugging Face
 * cache made here under the files' names (the policy `PrimeIntellect/Qwen3-0.6B-Reverse-Text-SFT`,
 * its teacher `...-Reverse-Text-RL`, the SFT base `PrimeIntellect/Qwen3-0.6B`), each served by
 * `prime-rl inference` (the teacher on its own server, as the debug configs expect it on :8001).
 *
 *  - reverse-text's eval.toml in the eval command's shape today against the served teacher, and an
 *    interrupted eval that resumes where it stopped (only the missing rollouts are played again);
 *  - an SFT from two datasets mixed by ratio (one a subset), with an eval source;
 *  - configs/debug/algo/{echo,opd,sft_distill,self_distill}.toml for two steps each, their metrics
 *    showing the new loss terms, and a demo_key the rows lack refused naming the key.
 *
 * The debug configs train on prime-rl's reverse-text and alphabet-sort tasksets, which are not
 * installed here: their sources become the reverse-chat taskset (two turns, the second after a
 * user message: echo's observation) and the steps, batch and lengths shrink; every algorithm key
 * is the file's. Real Temporal, engine, HTTP and verifiers env servers (.venv-verifiers; skipped,
 * saying why, without it).
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { cliCommands, type CommandTable } from '../lib/cli/main';
import type { Command } from '../lib/cli/command';
import { loadConfig } from '../lib/config/loader';
import type { EvalConfig, RLConfig, SFTConfig } from '../lib/config/schemas';
import { readEvalResults } from '../lib/eval';
import { EnvPool } from '../lib/envs/pool';
import type { InferenceServer } from '../lib/inference/server';
import { createModel } from '../lib/model/create';
import { projectRoot } from '../lib/paths';
import { readBatch } from '../lib/runfolder/batch';
import { RunLayout } from '../lib/runfolder/layout';
import { readStepMetrics } from '../lib/runfolder/metrics';
import { readRollouts } from '../lib/runfolder/rollouts';
import type { SftResult } from '../workflows/sft';
import type { EvalResult } from '../workflows/eval';
import { Failure } from '../lib/failures';
import { executeRl, executeRun, startServer, type Stack, startStack } from './support/harness';
import { addToHubCache, conversationsParquet, folderFiles } from './support/hub-cache';
import { verifiersSuite } from './support/setup';

const suite = verifiersSuite('prime-rl.algos.test.ts');

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-prl-algos-'));
const hub = path.join(root, 'hub');
const POLICY = 'PrimeIntellect/Qwen3-0.6B-Reverse-Text-SFT';
const TEACHER = 'PrimeIntellect/Qwen3-0.6B-Reverse-Text-RL';
const BASE = 'PrimeIntellect/Qwen3-0.6B';
const DATASETS = ['willcb/R1-reverse-wikipedia-paragraphs-v1-1000', 'PrimeIntellect/Reverse-Text-SFT'];
const REPO = path.join(projectRoot, 'test', 'fixtures', 'prime-rl', 'repo');
const OURS = path.join(projectRoot, 'test', 'fixtures', 'prime-rl');
const TASKSETS = path.join(projectRoot, 'test', 'fixtures', 'verifiers');
const commands: CommandTable = cliCommands({} as Command);
const saved = { HF_HUB_CACHE: process.env.HF_HUB_CACHE, PYTHONPATH: process.env.PYTHONPATH };
let stack: Stack & { inference: InferenceServer };
let teacher: InferenceServer;
const outputs = path.join(root, 'outputs');

/** A command's config from argv, as the CLI loads it. */
function load<T>(name: 'rl' | 'sft' | 'eval', argv: string[]): T {
  const cmd = commands[name] as Command;
  return loadConfig({ schema: cmd.schema, argv, env: {}, shared: cmd.shared, aliases: cmd.aliases?.flat() })
    .config as T;
}

/** Rows of reversals of words drawn from `letters`. */
function reversals(n: number, letters: string) {
  return Array.from({ length: n }, (_, i) => {
    const word = letters.slice(i % 4, (i % 4) + 3);
    return {
      prompt: [{ role: 'user', content: word }],
      completion: [{ role: 'assistant', content: [...word].reverse().join('') }],
    };
  });
}

/** The reverse-chat taskset as a prime-rl source becomes it: its agent `player`, a subprocess runtime. */
const reverseChat = (evalSize: number | 'all') => ({
  id: 'verifiers:reverse-chat',
  args: {
    taskset: { size: 8 },
    env: { player: { harness: { id: 'reverse-chat' }, runtime: { type: 'subprocess' } } },
    eval_size: evalSize,
  },
});

/** configs/debug/algo/<file>, shrunk to two steps of 4 rollouts on reverse-chat, `flags` on top. */
function debugConfig(file: string, runName: string, flags: string[] = []): RLConfig {
  return load<RLConfig>('rl', [
    ...['@', path.join(REPO, 'configs', 'debug', 'algo', file)],
    ...['--run-name', runName, '--output-dir', outputs, '--max-steps', '2', '--seq-len', '256'],
    ...['--orchestrator.batch-size', '4', '--orchestrator.rollouts-per-example', '2'],
    ...['--orchestrator.sampling.max-tokens', '12', '--eval.sampling.max-tokens', '12'],
    ...['--env', JSON.stringify([reverseChat(0)]), '--eval.env', JSON.stringify([reverseChat('all')])],
    ...['--eval.num-examples', '2', '--eval.interval', '100'],
    ...['--orchestrator.base-urls', `${stack.inference.url}/v1`, '--trainer.threads', '1'],
    ...flags,
  ]);
}

suite('prime-rl files run: algorithms, eval, SFT from several sources', () => {
  beforeAll(async () => {
    const made = path.join(root, 'made');
    createModel({ arch: 'qwen3', preset: 'tiny', tokenizer: 'qwen3', seed: 0, out: made });
    for (const name of [POLICY, TEACHER, BASE]) addToHubCache(hub, 'model', name, folderFiles(made));
    fs.rmSync(made, { recursive: true });
    addToHubCache(hub, 'dataset', DATASETS[0], {
      'data/train-00000-of-00001.parquet': conversationsParquet(reversals(12, 'abcdefgh')),
    });
    // A dataset of two configurations: the file names its `short` subset.
    addToHubCache(hub, 'dataset', DATASETS[1], {
      'short/train.parquet': conversationsParquet(reversals(4, 'pqrstuvw')),
      'long/train.parquet': conversationsParquet(reversals(4, 'klmnopqr')),
    });
    process.env.HF_HUB_CACHE = hub;
    process.env.PYTHONPATH = [TASKSETS, saved.PYTHONPATH].filter(Boolean).join(':');
    stack = await startStack(root, { modelDir: POLICY, seqLen: 256 });
    teacher = await startServer(root, { modelDir: TEACHER, seqLen: 256 });
    // Listing a taskset starts Python (imports verifiers): slower than the stack's default on a busy machine.
    await stack.pool.close();
    stack.pool = new EnvPool({ workers: 1, timeoutS: 120 });
  }, 300_000);
  afterAll(async () => {
    await teacher?.close(1000);
    await stack?.close();
    for (const [k, v] of Object.entries(saved))
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    fs.rmSync(root, { recursive: true, force: true });
  });

  /** The generate requests a server has answered (its /metrics). */
  const generated = async (server: InferenceServer) => {
    const text = await (await fetch(`${server.url}/metrics`)).text();
    return [
      ...text.matchAll(/^prime_inference_requests_total\{route="\/inference\/v1\/generate",status="200"\} (\d+)/gm),
    ]
      .map((m) => Number(m[1]))
      .reduce((a, b) => a + b, 0);
  };

  test("reverse-text's eval.toml against `prime-rl inference`; an interrupted eval resumes where it stopped", async () => {
    const argv = ['@', path.join(OURS, 'eval-sources.toml'), '--client.base-url', `${teacher.url}/v1`];
    const cfg = load<EvalConfig>('eval', [...argv, '--output-dir', outputs]);
    expect(cfg.run_name).toBe('reverse-text-eval');
    const before = await generated(teacher);
    // As `prime-rl eval` starts it: the workflow prepares its plan from the config.
    const result = await executeRun<EvalResult>(stack, 'eval', cfg, { args: [{ config: cfg }] });
    const m = result.results[0].environments['verifiers:reverse-chat'];
    expect(m).toMatchObject({ num_examples: 4, rollouts_per_example: 2 });
    // 8 rollouts of two turns each, every one on the served teacher.
    expect((await generated(teacher)) - before).toBe(16);
    const layout = RunLayout.of(outputs, cfg.run_name);
    // Interrupted: 3 rollouts and a torn line written, the (version, environment)'s result not yet.
    const parts = path.join(layout.dir, 'eval', 'parts');
    const version = fs.readdirSync(parts)[0];
    const rolloutsFile = fs.readdirSync(path.join(parts, version)).find((f) => f.endsWith('.rollouts.jsonl'))!;
    const lines = fs
      .readFileSync(path.join(parts, version, rolloutsFile), 'utf8')
      .split('\n')
      .filter(Boolean);
    expect(lines).toHaveLength(8);
    fs.writeFileSync(path.join(parts, version, rolloutsFile), `${lines.slice(0, 3).join('\n')}\n{"task": 7, "rew`);
    fs.rmSync(path.join(parts, version, rolloutsFile.replace('.rollouts.jsonl', '.json')));
    const again = await generated(teacher);
    const resumed = await executeRun<EvalResult>(stack, 'eval', cfg, {
      args: [{ config: cfg }],
      workflowId: `${cfg.run_name}-resumed`,
    });
    // Only the 5 missing rollouts were played again (10 turns); the result is the same shape.
    expect((await generated(teacher)) - again).toBe(10);
    expect(resumed.results[0].environments['verifiers:reverse-chat']).toMatchObject({ num_examples: 4 });
  }, 900_000);

  test('SFT from two datasets mixed 3:1 (one its subset), evaluated on a verifiers source every 2 steps', async () => {
    const server = await startServer(root, { modelDir: BASE, seqLen: 256 });
    try {
      const cfg = load<SFTConfig>('sft', [
        ...['@', path.join(OURS, 'sft-sources.toml')],
        ...['--run-name', 'prl-sft-sources', '--output-dir', outputs, '--threads', '1'],
        ...['--inference.server.port', new URL(server.url).port],
      ]);
      const result = await executeRun<SftResult>(stack, 'sft', cfg);
      expect(result.steps).toBe(4);
      const layout = RunLayout.of(cfg.output_dir, cfg.run_name);
      const plan = JSON.parse(fs.readFileSync(layout.sftPlanFile, 'utf8')) as { samples: number };
      expect(plan.samples).toBe(12 + 4); // both sources' rows, the subset's only
      // Each batch of 4: 3 samples of the first source, 1 of the second.
      for (let step = 0; step < 4; step++) expect(readBatch(layout.batchFile(step)).counts.samples).toBe(4);
      expect(readEvalResults(layout.dir).map((e) => e.model)).toEqual(['base', 'step_2', 'step_4']);
      const lines = readStepMetrics(layout.metricsFile);
      expect(lines.filter((l) => 'eval/verifiers:reverse-chat/avg@1' in l).map((l) => l.step)).toEqual([1, 3]);
    } finally {
      await server.close(1000);
    }
  }, 1_200_000);

  /** The metrics lines of a run and its step-0 batch. */
  const ran = (cfg: RLConfig) => {
    const layout = RunLayout.of(cfg.output_dir, cfg.run_name);
    return { layout, lines: readStepMetrics(layout.metricsFile), batch: readBatch(layout.batchFile(0)) };
  };

  test('echo.toml: the policy loss on the answers, cross-entropy on the user messages between them (ce_loss)', async () => {
    const cfg = debugConfig('echo.toml', 'prl-echo');
    expect(cfg.orchestrator.echo).toEqual({ roles: { user: 0.1 } });
    const servers = stack.pool.verifiers.stats.started;
    expect((await executeRl(stack, cfg)).steps).toBe(2);
    // Its train and eval entries (eval_size 0 and all) are one taskset config: one env server.
    expect(stack.pool.verifiers.stats.started - servers).toBeLessThanOrEqual(1);
    const { lines, batch } = ran(cfg);
    for (const l of lines) {
      expect(l.ce_tokens as number).toBeGreaterThan(0);
      expect(l.ce_loss as number).toBeGreaterThan(0);
      expect(l.loss_tokens as number).toBeGreaterThan(0);
    }
    // The observation tokens weigh 0.1, never a sampled one.
    for (const row of batch.rows)
      row.ceWeights!.forEach((w, t) => {
        expect([0, Math.fround(0.1)]).toContain(w);
        if (w > 0) expect(row.lossMask[t]).toBe(0);
      });
  }, 900_000);

  test('opd.toml: the served teacher scores every sampled token (teacher_kl), pure distillation', async () => {
    const cfg = debugConfig('opd.toml', 'prl-opd', ['--distill.teacher.base-url', `${teacher.url}/v1`]);
    expect(cfg.distill).toMatchObject({ type: 'opd', teacher: { model: TEACHER, served_model: TEACHER } });
    expect((await executeRl(stack, cfg)).steps).toBe(2);
    const { lines, layout } = ran(cfg);
    for (const l of lines) expect(Number.isFinite(l.teacher_kl as number)).toBe(true);
    const sampled = readRollouts(layout.rolloutsDir(0))
      .flatMap((r) => r.samples.flat())
      .filter((s) => s.generated);
    for (const s of sampled) expect(Array.from(s.teacherLogprobs ?? []).every((x) => typeof x === 'number')).toBe(true);
  }, 900_000);

  test('sft_distill.toml: the teacher plays the rollouts, the policy trains on its tokens by cross-entropy alone', async () => {
    const cfg = debugConfig('sft_distill.toml', 'prl-sft-distill', ['--distill.teacher.base-url', `${teacher.url}/v1`]);
    const before = await generated(teacher);
    expect((await executeRl(stack, cfg)).steps).toBe(2);
    const { lines, layout } = ran(cfg);
    for (const l of lines) {
      expect(l.loss_tokens).toBe(0);
      expect(l.ce_tokens as number).toBeGreaterThan(0);
      expect(l.ce_loss as number).toBeGreaterThan(0);
    }
    const rollouts = readRollouts(layout.rolloutsDir(0));
    expect(rollouts.every((r) => r.teacher === true)).toBe(true);
    // 2 steps x 4 rollouts x 2 turns on the teacher's server.
    expect((await generated(teacher)) - before).toBe(16);
  }, 900_000);

  test('self_distill.toml (opsd): the policy scores its tokens after the demonstration; a demo_key the rows lack stops the run naming it', async () => {
    const cfg = debugConfig('self_distill.toml', 'prl-opsd', ['--orchestrator.rollouts-per-example', '2']);
    expect(cfg.distill).toMatchObject({ type: 'opsd', demo_key: 'answer' });
    expect((await executeRl(stack, cfg)).steps).toBe(2);
    for (const l of ran(cfg).lines) expect(Number.isFinite(l.teacher_kl as number)).toBe(true);
    const bad = debugConfig('self_distill.toml', 'prl-opsd-bad', ['--distill.demo-key', 'expert']);
    const err = await executeRl(stack, bad, { executionTimeout: '120s' }).then(
      () => new Error('the run completed, but it should have been refused'),
      (e: unknown) => e,
    );
    let cause: unknown = err;
    while (cause instanceof Error && cause.cause) cause = cause.cause;
    // Bad input: not retried, and the CLI exits 2 (docs/workflow.md, failures that end a run).
    expect(cause).toMatchObject({ nonRetryable: true, type: Failure.InvalidConfig });
    expect((cause as Error).message).toMatch(
      /^distill\.demo_key = "expert": example \d+ of verifiers:reverse-chat has no such field holding text \(it has: task_data, .*answer.*\)/,
    );
  }, 900_000);
});
