/**
 * prime-rl's own config files (test/fixtures/prime-rl/repo/: every single-node file of its
 * examples/basic, configs/basic, configs/ci/integration, configs/ci/nightly-fft, configs/debug/algo,
 * configs/debug/multi-env, the eval files of configs/basic and examples/evals, and the k8s example's
 * per-process files, copied key for key), and the shapes its eval and SFT files take today
 * (test/fixtures/prime-rl/), resolved with `--dry-run` by the command prime-rl runs each with, every
 * model and dataset name found in a Hugging Face cache made here. Its files that need what a single
 * machine here does not do (configs/debug/concurrency.toml: several nodes; configs/debug/fake: fake
 * data) exit 2 naming the key. Bad input in those shapes exits 2 naming the key.
 */
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { cliCommands, type CommandTable } from '../lib/cli/main';
import type { Command } from '../lib/cli/command';
import { loadConfig } from '../lib/config/loader';
import type { EvalConfig, RLConfig, SFTConfig } from '../lib/config/schemas';
import { projectRoot } from '../lib/paths';
import { configError } from './support/config-error';
import { addToHubCache, conversationsParquet, folderFiles } from './support/hub-cache';
import { tinyModel } from './support/setup';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-prl-repo-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
const REPO = path.join('test', 'fixtures', 'prime-rl', 'repo');
const OURS = path.join('test', 'fixtures', 'prime-rl');
const hub = path.join(dir, 'hub');

type Name = 'rl' | 'sft' | 'eval' | 'inference';

/** Every file of the copied repository, with the command prime-rl runs it with. */
function repoFiles(): { file: string; name: Name }[] {
  const out: { file: string; name: Name }[] = [];
  const walk = (rel: string) => {
    for (const e of fs.readdirSync(path.join(projectRoot, rel), { withFileTypes: true })) {
      const p = path.join(rel, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.toml')) out.push({ file: p, name: commandOf(p) });
    }
  };
  walk(REPO);
  return out
    .filter((f) => !/k8s\/.*\/(orch|train)\.toml$/.test(f.file)) // scoped into `rl`, below
    .filter((f) => !REFUSED.some((r) => f.file.endsWith(r.file))) // refused, below
    .sort((a, b) => a.file.localeCompare(b.file));
}

function commandOf(file: string): Name {
  if (/\/sft\.toml$|reverse-text-sft(-lora)?\//.test(file)) return 'sft';
  if (/examples\/evals\/|\/eval\.toml$/.test(file)) return 'eval';
  if (/infer\.toml$/.test(file)) return 'inference';
  return 'rl';
}

const commands: CommandTable = cliCommands({} as Command);
/** A command's config from argv, as the CLI loads it. */
function load<T>(name: Name, argv: string[]): T {
  const cmd = commands[name] as Command;
  return loadConfig({
    schema: cmd.schema,
    argv,
    env: {},
    cwd: projectRoot,
    shared: cmd.shared,
    aliases: cmd.aliases?.flat(),
  }).config as T;
}
const loadText = <T>(name: Name, text: string, argv: string[] = []) => {
  const file = path.join(dir, `${name}-${Math.random().toString(36).slice(2)}.toml`);
  fs.writeFileSync(file, text);
  return load<T>(name, ['@', file, ...argv]);
};

/** The CLI as users run it (bin/prime-rl.js, which runs dist/), off the event loop. */
function cli(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [path.join(projectRoot, 'bin', 'prime-rl.js'), ...args], {
      cwd: projectRoot,
      env: { PATH: process.env.PATH, HOME: dir, HF_HUB_CACHE: hub },
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** Runs `fn` over `items`, `n` at a time. */
async function inBatches<T, R>(items: readonly T[], n: number, fn: (t: T) => Promise<R>): Promise<R[]> {
  const out: R[] = [];
  for (let i = 0; i < items.length; i += n) out.push(...(await Promise.all(items.slice(i, i + n).map(fn))));
  return out;
}

/** The hub names each command's config uses (what the CLI resolves before it starts anything). */
function hubRefs(name: Name, argv: string[]) {
  const cmd = commands[name] as Command;
  return cmd.hubNames?.(load(name, argv)) ?? [];
}

/** prime-rl's files that need what we refuse, with the command prime-rl runs each with and the refusal. */
const REFUSED: { file: string; name: Name | 'trainer'; error: RegExp }[] = [
  {
    file: 'configs/debug/concurrency.toml',
    name: 'rl',
    error: /deployment\.type .*"multi_node".*multi-node deployment: start the pieces on each host/,
  },
  { file: 'configs/debug/fake/sft.toml', name: 'sft', error: /data\.type .*"fake".*fake data/ },
  { file: 'configs/debug/fake/rl.toml', name: 'trainer', error: /prime-rl rl --trainer @ train\.toml/ },
];
const FILES = repoFiles();
const K8S = path.join(REPO, 'k8s', 'prime-rl', 'examples', 'reverse-text');
const K8S_RL = [
  '--inference',
  '@',
  `${K8S}/infer.toml`,
  '--orchestrator',
  '@',
  `${K8S}/orch.toml`,
  '--trainer',
  '@',
  `${K8S}/train.toml`,
];
const OURS_FILES: { argv: string[]; name: Name }[] = [
  { argv: ['@', path.join(OURS, 'eval-sources.toml')], name: 'eval' },
  { argv: ['@', path.join(OURS, 'sft-sources.toml')], name: 'sft' },
  { argv: K8S_RL, name: 'rl' },
];

beforeAll(() => {
  // One tiny model under every model name the files use, a parquet dataset under every dataset name.
  const model = tinyModel(path.join(dir, 'model'));
  const files = folderFiles(model);
  const data = conversationsParquet([
    { prompt: [{ role: 'user', content: 'abc' }], completion: [{ role: 'assistant', content: 'cba' }] },
  ]);
  const seen = new Set<string>();
  for (const { argv, name } of [...FILES.map((f) => ({ argv: ['@', f.file], name: f.name })), ...OURS_FILES])
    for (const ref of hubRefs(name, argv)) {
      if (seen.has(`${ref.type}:${ref.name}`)) continue;
      seen.add(`${ref.type}:${ref.name}`);
      addToHubCache(
        hub,
        ref.type,
        ref.name,
        ref.type === 'model' ? files : { 'data/train-00000-of-00001.parquet': data, 'short/train.parquet': data },
      );
    }
  expect(seen.size).toBeGreaterThan(8);
}, 120_000);

test("the copied repository holds each shape's files (prime-rl's single-node configs)", () => {
  const byDir = (re: RegExp) => FILES.filter((f) => re.test(f.file)).length;
  expect(byDir(/examples\/basic\//)).toBe(7);
  expect(byDir(/configs\/basic\//)).toBe(11);
  expect(byDir(/configs\/ci\/integration\//)).toBe(13);
  expect(byDir(/configs\/ci\/nightly-fft\//)).toBe(5);
  expect(byDir(/configs\/debug\/algo\//)).toBe(10);
  expect(byDir(/configs\/debug\/multi-env\//)).toBe(1);
  expect(byDir(/examples\/evals\//)).toBe(1);
  expect(FILES.filter((f) => f.name === 'eval').map((f) => path.basename(path.dirname(f.file)))).toEqual([
    'alphabet-sort',
    'reverse-text',
    'wiki-search',
    'wordle',
    'evals',
  ]);
  expect(byDir(/k8s\//)).toBe(1);
});

test('every file resolves with --dry-run under its command; every key is listed where it went; every hub name is found', async () => {
  const runs = [
    ...FILES.map((f) => ({ label: f.file, name: f.name, argv: ['@', f.file] })),
    ...OURS_FILES.map((f) => ({ label: f.argv.join(' '), ...f })),
  ];
  const results = await inBatches(runs, 4, async (r) => ({ ...r, out: await cli([r.name, ...r.argv, '--dry-run']) }));
  for (const { label, name, argv, out } of results) {
    // The file's label first: a failure names the file that did not resolve.
    expect([label, out.stderr.match(/^error.*$/m)?.[0] ?? null, out.code]).toEqual([label, null, 0]);
    JSON.parse(out.stdout);
    // Every Hugging Face name resolved from the cache made here.
    expect([label, out.stderr.includes('not found (the run would exit 2)')]).toEqual([label, false]);
    if (hubRefs(name, argv).length > 0) expect([label, out.stderr.includes(`-> ${hub}/`)]).toEqual([label, true]);
  }
}, 600_000);

test('what the algorithm files become', () => {
  const algo = (f: string) => load<RLConfig>('rl', ['@', path.join(REPO, 'configs', 'debug', 'algo', f)]);
  expect(algo('grpo.toml').orchestrator.advantage.type).toBe('grpo');
  expect(algo('max_rl.toml').orchestrator.advantage.type).toBe('max_rl');
  expect(algo('rae.toml').orchestrator.advantage).toMatchObject({ type: 'rae', decay: 0.95 });
  expect(algo('rae.toml').orchestrator.rollouts_per_example).toBe(1);
  const opd = algo('opd.toml').distill;
  expect(opd).toMatchObject({
    type: 'opd',
    weight: 0,
    teacher: {
      base_url: 'http://localhost:8001/v1',
      model: 'PrimeIntellect/Qwen3-0.6B-Reverse-Text-RL',
      served_model: 'PrimeIntellect/Qwen3-0.6B-Reverse-Text-RL',
    },
  });
  expect(algo('sft_distill.toml').distill).toMatchObject({
    type: 'sft',
    teacher: { base_url: 'http://localhost:8001/v1' },
  });
  expect(algo('self_distill.toml').distill).toMatchObject({ type: 'opsd', demo_key: 'answer' });
  expect(algo('self_distill.toml').distill.template).toContain('{demonstration}');
  const echo = algo('echo.toml');
  expect([echo.orchestrator.advantage.type, echo.orchestrator.echo]).toEqual(['grpo', { roles: { user: 0.1 } }]);
  // Per source: the second source distills from its teacher, the first keeps the run's grpo.
  const mixed = algo('mixed_grpo_opd.toml');
  expect(mixed.distill.teacher).toBeUndefined();
  expect(mixed.env[0]).not.toHaveProperty('distill');
  expect(mixed.env[1]).toMatchObject({ distill: { type: 'opd' }, echo: false, advantage: { type: 'grpo' } });
  // LoRA variants train an adapter of rank 8.
  expect(algo('opd_lora.toml').trainer.lora).toMatchObject({ enabled: true, rank: 8 });
});

test('what the CI, nightly and example files become: concurrency, gates, seq_len, skip_*, the k8s files', () => {
  const ci = load<RLConfig>('rl', ['@', path.join(REPO, 'configs', 'ci', 'nightly-fft', 'wiki-search.toml')]);
  expect(ci.orchestrator.concurrency).toEqual({ initial_inflight: 128, min_inflight: 1, max_inflight: 128 });
  expect(ci.inference.replicas).toBe(4);
  const wiki = load<RLConfig>('rl', ['@', path.join(REPO, 'examples', 'basic', 'wiki-search', 'rl.toml')]);
  expect(wiki.env[0].gates).toEqual({ zero_advantage: { type: 'advantage_range', reject_min: 0, reject_max: 0 } });
  // The trainer's rows (16384) above the orchestrator's samples (8192), as prime-rl allows.
  const hendrycks = load<RLConfig>('rl', ['@', path.join(REPO, 'examples', 'basic', 'hendrycks-sanity', 'rl.toml')]);
  expect([hendrycks.trainer.seq_len, hendrycks.orchestrator.seq_len, hendrycks.inference.seq_len]).toEqual([
    16384, 8192, 8192,
  ]);
  const offload = load<SFTConfig>('sft', [
    '@',
    path.join(REPO, 'configs', 'ci', 'integration', 'reverse-text-sft', 'full-offload-resume.toml'),
  ]);
  expect(offload.ckpt).toMatchObject({ resume_step: 5, skip_optimizer: true, skip_scheduler: true });
  expect(offload.optim.lr).toBe(0);
  // The k8s example's per-process files, each scoped to its section of one run.
  const k8s = load<RLConfig>('rl', K8S_RL);
  expect([k8s.model.name, k8s.max_steps, k8s.seq_len, k8s.orchestrator.batch_size]).toEqual([
    'PrimeIntellect/Qwen3-0.6B-Reverse-Text-SFT',
    20,
    2048,
    128,
  ]);
  expect(k8s.orchestrator.rollouts_per_example).toBe(16);
  expect(k8s.env[0].id).toBe('verifiers:reverse-text');
  expect(k8s.trainer.optim.lr).toBe(3e-6);
  expect(k8s.wandb).toEqual({ project: 'reverse-text', name: 'reverse-text' });
});

test("prime-rl's files that need several nodes or fake data exit 2 naming the key", async () => {
  for (const r of REFUSED) {
    const out = await cli([r.name, '@', path.join(REPO, r.file), '--dry-run']);
    expect([r.file, out.code]).toEqual([r.file, 2]);
    expect(out.stderr).toMatch(r.error);
  }
});

test("the eval command's shape today and SFT from several sources", () => {
  // configs/basic's eval files: top-level num_examples and group_size, one source, a served model.
  const rt = load<EvalConfig>('eval', ['@', path.join(REPO, 'configs', 'basic', 'reverse-text', 'eval.toml')]);
  expect([rt.model.name, rt.num_examples, rt.rollouts_per_example, rt.sampling.max_tokens, rt.client.base_url]).toEqual(
    ['Qwen/Qwen3-0.6B', 20, 3, 1024, 'http://localhost:8000/v1'],
  );
  expect(rt.env).toEqual([
    expect.objectContaining({
      id: 'verifiers:reverse-text',
      args: expect.objectContaining({
        env: { agent: { harness: { id: 'null' }, runtime: { type: 'subprocess' } } },
      }),
    }),
  ]);
  const sort = load<EvalConfig>('eval', ['@', path.join(REPO, 'configs', 'basic', 'alphabet-sort', 'eval.toml')]);
  expect(sort.env[0].args).toMatchObject({ taskset: { min_turns: 3, max_turns: 5, task: { power_per_turn: false } } });

  const e = load<EvalConfig>('eval', ['@', path.join(OURS, 'eval-sources.toml')]);
  expect([e.run_name, e.num_examples, e.rollouts_per_example, e.client.base_url]).toEqual([
    'reverse-text-eval',
    4,
    2,
    'http://localhost:8000/v1',
  ]);
  expect(e.sampling).toMatchObject({ max_tokens: 16, temperature: 0.7 });
  expect(e.concurrency).toEqual({ min_inflight: 1, max_inflight: 8 });
  expect(e.env).toEqual([expect.objectContaining({ id: 'verifiers:reverse-chat' })]);
  const swe = load<EvalConfig>('eval', ['@', path.join(REPO, 'examples', 'evals', 'swe.toml')]);
  expect(swe.concurrency).toEqual({ min_inflight: 32, max_inflight: 32 });
  expect(swe.env.map((x) => x.id)).toEqual(['verifiers:swebench-verified', 'verifiers:terminal-bench-2']);
  const s = load<SFTConfig>('sft', ['@', path.join(OURS, 'sft-sources.toml')]);
  expect(s.data.source).toEqual([
    { name: 'willcb/R1-reverse-wikipedia-paragraphs-v1-1000', split: 'train', ratio: 3 },
    {
      name: 'PrimeIntellect/Reverse-Text-SFT',
      subset: 'short',
      split: 'train',
      ratio: 1,
      renderer: { name: 'default' },
    },
  ]);
  expect([s.eval.num_examples, s.eval.rollouts_per_example, s.eval.concurrency.max_inflight]).toEqual([2, 1, 8]);
});

describe('bad input exits 2 naming the key', () => {
  const BASE = 'seq_len = 256\n[model]\nname = "m"\n';
  test.each([
    [
      'sft',
      'a source ratio of 0',
      '[model]\nname = "m"\n[[data.source]]\ndataset = "a/b"\nratio = 0\n',
      /data\.source\[0\]\.ratio: Too small: expected number to be >0/,
    ],
    [
      'sft',
      'a negative ratio',
      '[model]\nname = "m"\n[[data.source]]\ndataset = "a/b"\nratio = -1\n',
      /data\.source\[0\]\.ratio: Too small/,
    ],
    [
      'rl',
      'an unknown algorithm',
      `${BASE}[orchestrator.algo]\ntype = "ppo2"\n`,
      /orchestrator\.algo\.type \(in .*\) has no equivalent here: unknown algorithm "ppo2"/,
    ],
    [
      'rl',
      'hierarchical_grpo',
      `${BASE}[orchestrator.algo]\ntype = "hierarchical_grpo"\nepisode_agents = ["solver"]\n`,
      /orchestrator\.algo\.type .*proposer-solver/,
    ],
    ['rl', 'an unknown distillation type', `${BASE}[distill]\ntype = "dpo"\n`, /distill\.type: Invalid option/],
    [
      'rl',
      'min_inflight above max_inflight',
      `${BASE}[orchestrator.concurrency]\nmin_inflight = 64\nmax_inflight = 32\n`,
      /orchestrator\.concurrency\.min_inflight: 64 is above max_inflight \(32\)/,
    ],
    [
      'eval',
      'min_inflight above max_inflight',
      'model = "m"\n[concurrency]\nmin_inflight = 9\nmax_inflight = 8\n',
      /concurrency\.min_inflight: 9 is above max_inflight/,
    ],
    [
      'rl',
      'sft without a teacher to sample from',
      `${BASE}[orchestrator.algo]\ntype = "sft"\n`,
      /orchestrator\.algo\.sampling\.source .*samples from a teacher/,
    ],
    [
      'rl',
      'a teacher without its name',
      `${BASE}[orchestrator.algo]\ntype = "opd"\nteacher = { base_url = "http://h:1/v1" }\n`,
      /orchestrator\.algo\.teacher .*needs name/,
    ],
    [
      'rl',
      'a key of another algorithm',
      `${BASE}[orchestrator.algo]\ntype = "grpo"\ndecay = 0.9\n`,
      /orchestrator\.algo\.decay .*not a setting of algorithm "grpo"/,
    ],
    [
      'rl',
      'a difficulty-pool sampler',
      `${BASE}[[orchestrator.train.source]]\nenv.taskset.id = "t"\ncurriculum = { sampler = { type = "difficulty_pool" } }\n`,
      /orchestrator\.train\.source\[0\]\.curriculum\.sampler .*difficulty_filter/,
    ],
    ['rl', 'an empty demo_key', `${BASE}[distill]\ntype = "opsd"\ndemo_key = ""\n`, /distill\.demo_key: Too small/],
  ] as const)('%s: %s', (name, _label, text, message) => {
    expect(configError(() => loadText(name, text))).toMatch(message);
  });

  test("prime-rl's orchestrator and trainer commands name the command that reads their files", async () => {
    for (const part of ['orchestrator', 'trainer']) {
      const r = await cli([part, '@', `${K8S}/${part === 'trainer' ? 'train' : 'orch'}.toml`]);
      expect(r.code).toBe(2);
      expect(r.stderr).toContain(`prime-rl rl --${part} @`);
    }
  });
});
