/**
 * prime-rl's config classes as they are today (lib/config/prime-rl.ts): fixtures written in its
 * shapes (test/fixtures/prime-rl/, every table, both spellings) load through our CLI's tables as a
 * user runs them; `--dry-run` lists what each key became; every key with no equivalent is refused
 * naming it. Hugging Face names resolve from a cache made here, or exit 2 saying where they were
 * looked for and how to download them.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parse as parseToml } from 'smol-toml';
import type { Alias } from '../lib/config/aliases';
import { cliCommands, type CommandTable } from '../lib/cli/main';
import type { Command } from '../lib/cli/command';
import { loadConfig } from '../lib/config/loader';
import { PRIME_RL_EVAL_KEYS, PRIME_RL_RL_KEYS, PRIME_RL_SFT_KEYS } from '../lib/config/prime-rl';
import type { EvalConfig, RLConfig, SFTConfig } from '../lib/config/schemas';
import { projectRoot } from '../lib/paths';
import { addToHubCache, folderFiles } from './support/hub-cache';
import { configError } from './support/config-error';
import { tinyModel } from './support/setup';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-prl-config-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
const FIXTURES = path.join('test', 'fixtures', 'prime-rl');
const fixture = (name: string) => path.join(projectRoot, FIXTURES, name);

const commands: CommandTable = cliCommands({} as Command);
type Name = 'rl' | 'sft' | 'eval';

/** A command's config loaded as the CLI loads it (its schema, shared keys and alias tables). */
function load<T>(name: Name, argv: string[]): T {
  const cmd = commands[name] as Command;
  return loadConfig({ schema: cmd.schema, argv, env: {}, cwd: dir, shared: cmd.shared, aliases: cmd.aliases?.flat() })
    .config as T;
}
const loadText = <T>(name: Name, text: string, argv: string[] = []) => {
  const file = path.join(dir, `${name}-${Math.random().toString(36).slice(2)}.toml`);
  fs.writeFileSync(file, text);
  return load<T>(name, ['@', file, ...argv]);
};

/** The CLI as users run it (the compiled bin/prime-rl.js). */
function cli(args: string[], env: NodeJS.ProcessEnv = {}) {
  const r = spawnSync(process.execPath, [path.join(projectRoot, 'bin', 'prime-rl.js'), ...args], {
    cwd: projectRoot,
    env: { PATH: process.env.PATH, HOME: dir, ...env },
    encoding: 'utf8',
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Dotted leaf keys of a TOML table; an array of tables is a leaf. */
function leafKeys(tree: Record<string, unknown>, prefix = ''): string[] {
  return Object.entries(tree).flatMap(([k, v]) =>
    typeof v === 'object' && v !== null && !Array.isArray(v) && Object.keys(v).length > 0
      ? leafKeys(v as Record<string, unknown>, `${prefix}${k}.`)
      : [`${prefix}${k}`],
  );
}

test('rl: prime-rl today (every table) lands on our keys; its sources are verifiers environments, agent `player`', () => {
  const c = load<RLConfig>('rl', ['@', fixture('rl.toml')]);
  expect([c.max_steps, c.seq_len, c.model.name]).toEqual([20, 256, 'PrimeIntellect/Qwen3-0.6B']);
  expect(c.trainer.world_size).toBe(2);
  expect(c.wandb).toEqual({ project: 'reverse-chat', name: 'reverse-chat' });
  expect(c.orchestrator).toMatchObject({ batch_size: 16, rollouts_per_example: 4, seq_len: 256 });
  expect(c.orchestrator.sampling).toMatchObject({ max_tokens: 64, temperature: 0.8 });
  expect(c.env).toEqual([
    {
      id: 'verifiers:reverse-chat',
      weight: 1,
      args: expect.objectContaining({
        taskset: { size: 12 },
        env: { player: { harness: { id: 'reverse-chat' }, runtime: { type: 'subprocess' } } },
        eval_size: 0,
      }),
    },
  ]);
  expect(c.eval).toMatchObject({ interval: 5, num_examples: 4 });
  expect(c.eval.env).toEqual([
    expect.objectContaining({
      id: 'verifiers:reverse-chat',
      rollouts_per_example: 3,
      args: expect.objectContaining({ taskset: { seed: 1 }, env: {}, eval_size: 'all' }),
    }),
  ]);
  expect(c.orchestrator.renderer).toEqual({ name: 'default', reasoning_parser: 'think' });
  expect(c.trainer.seq_len).toBe(256);
  expect(c.trainer.lora).toMatchObject({ enabled: true, rank: 8, alpha: 16 });
  expect(c.trainer.model.ac).toEqual({ freq: 2 });
  expect(c.trainer.optim.lr).toBe(3e-6);
  // max_model_len: the server may hold longer sequences than the run makes.
  expect([c.inference.seq_len, c.orchestrator.seq_len]).toEqual([512, 256]);
});

test('rl: the spellings prime-rl used before ([wandb], [[orchestrator.train.env]], taskset and harness on the entry)', () => {
  const c = load<RLConfig>('rl', ['@', fixture('rl-older.toml')]);
  expect(c.wandb).toEqual({ project: 'reverse-chat' });
  expect(c.env).toEqual([
    expect.objectContaining({
      id: 'verifiers:reverse_words',
      args: expect.objectContaining({
        taskset: { size: 12 },
        env: { agent: { harness: { id: 'reverse_words' }, runtime: { type: 'subprocess' } } },
      }),
    }),
  ]);
  // Both spellings of one key in one file: an error naming both.
  expect(
    configError(() =>
      loadText('rl', `${fs.readFileSync(fixture('rl-older.toml'), 'utf8')}\n[monitors.wandb]\nproject = "other"\n`),
    ),
  ).toMatch(/monitors\.wandb\.project = "other" and .*wandb\.project/);
});

test('sft and eval: prime-rl today lands on our keys', () => {
  const s = load<SFTConfig>('sft', ['@', fixture('sft.toml')]);
  expect([s.max_steps, s.model.name, s.seq_len, s.batch_size, s.optim.lr]).toEqual([
    4,
    'PrimeIntellect/Qwen3-0.6B',
    256,
    4,
    2e-4,
  ]);
  expect(s.data).toMatchObject({ name: 'willcb/R1-reverse-wikipedia-paragraphs-v1-1000', split: 'train' });
  expect(s.eval).toMatchObject({ interval: 2, num_examples: 2, sampling: expect.objectContaining({ max_tokens: 16 }) });
  expect(s.eval.env).toEqual([
    expect.objectContaining({
      id: 'verifiers:reverse-chat',
      args: expect.objectContaining({
        env: { player: { harness: { id: 'reverse-chat' }, runtime: { type: 'subprocess' } } },
      }),
    }),
  ]);
  const e = load<EvalConfig>('eval', ['@', fixture('eval.toml')]);
  expect(e.model.name).toBe('PrimeIntellect/Qwen3-0.6B');
  expect([e.num_examples, e.rollouts_per_example]).toEqual([4, 2]);
  expect(e.sampling).toMatchObject({ max_tokens: 16, temperature: 0.7 });
  expect(e.env).toEqual([expect.objectContaining({ id: 'verifiers:reverse-chat' })]);
  // -1 (prime-rl's default) is every example.
  expect(loadText<EvalConfig>('eval', 'model = "m"\n[eval]\nnum_examples = -1\n').num_examples).toBe(-1);
  // SFT data details: loss_mask, splits, micro batches.
  const d = loadText<SFTConfig>(
    'sft',
    '[model]\nname = "m"\n[data]\nname = "a/b"\nsplits = ["test"]\nmicro_batch_size = 2\n[data.loss_mask]\nuser = true\n',
  );
  expect(d.data).toMatchObject({ name: 'a/b', split: 'test', loss_roles: ['user', 'assistant'] });
});

test.each([
  ['rl', 'rl.toml'],
  ['rl', 'rl-older.toml'],
  ['sft', 'sft.toml'],
  ['eval', 'eval.toml'],
])('%s @ %s --dry-run: every key of the file is listed where it went, or is ours', (name, file) => {
  const rel = path.join(FIXTURES, file);
  const r = cli([name, '@', rel, '--dry-run']);
  expect(r.stderr).not.toMatch(/^error/m);
  expect(r.code).toBe(0);
  const resolved = JSON.parse(r.stdout) as Record<string, unknown>;
  const tree = parseToml(fs.readFileSync(path.join(projectRoot, rel), 'utf8')) as Record<string, unknown>;
  for (const key of leafKeys(tree)) {
    const value = key.split('.').reduce<unknown>((t, k) => (t as Record<string, unknown>)[k], tree);
    const listed = Array.isArray(value) ? `  ${key}[0].` : `  ${key} = `;
    if (r.stderr.includes(listed)) continue;
    // Not listed: the key is ours, and the resolved config holds the file's value.
    const got = key.split('.').reduce<unknown>((t, k) => (t as Record<string, unknown> | undefined)?.[k], resolved);
    if (typeof value === 'object' && value !== null) expect(got).toMatchObject(value);
    else expect([key, got]).toEqual([key, value]);
  }
});

/** Each alias table's refused keys (`refuse`) and checked values (`check`), by command. */
const TABLES: [Name, readonly Alias[]][] = [
  ['rl', PRIME_RL_RL_KEYS],
  ['sft', PRIME_RL_SFT_KEYS],
  ['eval', PRIME_RL_EVAL_KEYS],
];
const BASE: Record<Name, string> = { rl: 'seq_len = 256\n', sft: '', eval: '' };
/** The model each command needs, as a flag (a file's [model] table would clash with one under test). */
const MODEL = ['--model.name', 'm'];
/** The command's base config with `key` (dotted) set to `value` (a top-level key before its tables). */
const withSetting = (name: Name, key: string, value: string) => {
  const parts = key.split('.');
  const leaf = `${parts[parts.length - 1]} = ${value}\n`;
  return parts.length === 1 ? leaf + BASE[name] : `${BASE[name]}[${parts.slice(0, -1).join('.')}]\n${leaf}`;
};

test.each(
  TABLES.flatMap(([name, table]) =>
    table.filter((a) => a.refuse).map((a) => [name, a.table ? `${a.from}.some_key` : a.from, a.refuse!] as const),
  ),
)('%s refuses %s, naming it and why', (name, key, reason) => {
  // A value the key could take; for a key that is also a table of ours, a table.
  const message = configError(() => loadText(name as Name, withSetting(name as Name, key, '"x"'), MODEL));
  expect(message).toContain(`${key} (in `);
  expect(message).toContain(`has no equivalent here: ${reason}`);
});

test.each(
  TABLES.flatMap(([name, table]) =>
    table.filter((a) => a.refuse && a.presence).map((a) => [name, a.from, a.refuse!] as const),
  ),
)('%s refuses an empty [%s] table too (it turns the feature on), naming it', (name, key, reason) => {
  const parts = key.split('.');
  const text = `${BASE[name as Name]}[${parts.join('.')}]\n`;
  expect(configError(() => loadText(name as Name, text, MODEL))).toContain(`${key} (in `);
  expect(configError(() => loadText(name as Name, text, MODEL))).toContain(reason);
});

test.each(
  TABLES.flatMap(([name, table]) => table.filter((a) => a.check && !a.table).map((a) => [name, a.from] as const)),
)('%s refuses a value of %s that is not ours, naming the key', (name, key) => {
  const message = configError(() => loadText(name as Name, withSetting(name as Name, key, '"__not_ours__"'), MODEL));
  expect(message).toContain(`${key} (in `);
  expect(message).toContain('has no equivalent here for "__not_ours__"');
});

test('a flag whose key sets nothing of ours reads its value as the key in a file would: true, a number, a string', () => {
  // --inference.dry-run true was read as a number ("expected a number, got 'true'").
  const rl = [...MODEL, '--seq-len', '256'];
  expect(configError(() => load('rl', [...rl, '--inference.dry-run', 'true']))).toMatch(
    /inference\.dry_run .*has no equivalent here for true \(false only\): give --dry-run on the command line/,
  );
  expect(() => load('rl', [...rl, '--inference.dry-run', 'false'])).not.toThrow();
  expect(() => load('rl', [...rl, '--inference.server.liveness-timeout-seconds', '30'])).not.toThrow();
  expect(configError(() => load('rl', [...rl, '--inference.server.liveness-timeout-seconds', '60']))).toMatch(
    /has no equivalent here for 60 \(30 only\)/,
  );
  expect(() => load('rl', [...rl, '--inference.deployment.type', 'single_node'])).not.toThrow();
});

test.each([
  [
    'rl',
    '[[orchestrator.train.source]]\nsampling = { temperature = 0.5 }\nenv.taskset.id = "t"\n',
    'orchestrator.train.source[0].sampling',
    /one sampling for all environments/,
  ],
  [
    'rl',
    '[[orchestrator.train.source]]\nalgo = { type = "hierarchical_grpo" }\nenv.taskset.id = "t"\n',
    'orchestrator.train.source[0].algo.type',
    /proposer-solver/,
  ],
  [
    'rl',
    '[[orchestrator.train.source]]\ncurriculum = { gates = { g = { type = "pool" } } }\nenv.taskset.id = "t"\n',
    'orchestrator.train.source[0].curriculum.gates.g.type',
    /admission gate "pool": ours is advantage_range/,
  ],
  [
    'rl',
    '[[orchestrator.train.source]]\nserve = { address = "tcp://h:1" }\nenv.taskset.id = "t"\n',
    'orchestrator.train.source[0].serve.address',
    /start each env server/,
  ],
  [
    'rl',
    '[[orchestrator.train.source]]\naddress = "tcp://h:1"\nenv.taskset.id = "t"\n',
    'orchestrator.train.source[0].address',
    /start each env server/,
  ],
  [
    'rl',
    '[orchestrator]\ngroup_size = 4\n[[orchestrator.train.source]]\ngroup_size = 2\nenv.taskset.id = "t"\n',
    'orchestrator.train.source[0].group_size',
    /one group size/,
  ],
  [
    'rl',
    '[[orchestrator.train.source]]\nnum_examples = 2\nenv.taskset.id = "t"\n',
    'orchestrator.train.source[0].num_examples',
    /whole taskset/,
  ],
  [
    'rl',
    '[orchestrator.eval]\ninterval = 5\n[[orchestrator.eval.source]]\ninterval = 3\nenv.taskset.id = "t"\n',
    'orchestrator.eval.source[0].interval',
    /one eval interval/,
  ],
  [
    'rl',
    '[[orchestrator.train.source]]\nbogus = 1\nenv.taskset.id = "t"\n',
    'orchestrator.train.source[0].bogus',
    /not a field of a prime-rl source/,
  ],
  [
    'rl',
    '[orchestrator.algo]\ntype = "hierarchical_grpo"\n',
    'orchestrator.algo.type',
    /algorithm "hierarchical_grpo"/,
  ],
  ['rl', '[trainer.loss]\ntype = "custom"\n', 'trainer.loss.type', /custom loss functions/],
  [
    'rl',
    '[orchestrator.train.sampling.extra_body]\nrepetition_penalty = 1.1\n',
    'orchestrator.train.sampling.extra_body.repetition_penalty',
    /vLLM request field/,
  ],
  ['sft', '[data]\nsplits = ["train", "test"]\n', 'data.splits', /one split per dataset/],
  ['sft', '[val.data]\nname = "a/b"\nseq_len = 99\n', 'val.data.seq_len', /packed like the training data/],
] as const)('%s refuses what a source or a converted key cannot be here: %s', (name, text, key, why) => {
  const message = configError(() => loadText(name, BASE[name] + text, MODEL));
  expect(message).toContain(`${key} (in `);
  expect(message).toMatch(why);
});

test('a source without a taskset id, and a renderer with no verifiers environment, are errors naming them', () => {
  expect(configError(() => loadText('rl', `${BASE.rl}[[orchestrator.train.source]]\nname = "x"\n`, MODEL))).toMatch(
    /orchestrator\.train\.source\[0\] .*no env configured: set env\.taskset\.id/,
  );
  expect(
    configError(() =>
      loadText('rl', `${BASE.rl}[[env]]\nid = "reverse-text"\n[orchestrator.renderer]\nname = "qwen3"\n`, MODEL),
    ),
  ).toMatch(/orchestrator\.renderer: is the renderer of verifiers environments' env servers, and this run has none/);
  expect(configError(() => loadText('rl', `${BASE.rl}[inference.vllm]\nmax_model_len = 128\n`, MODEL))).toMatch(
    /inference\.seq_len = 128 .* is below seq_len = 256/,
  );
});

describe('Hugging Face names from the local cache', () => {
  const cache = path.join(dir, 'hub');
  const model = path.join(dir, 'model');
  beforeAll(() => {
    tinyModel(model);
    addToHubCache(cache, 'model', 'PrimeIntellect/Qwen3-0.6B', folderFiles(model));
  });

  test('--dry-run lists the snapshot a name resolves to (HF_HUB_CACHE, else HF_HOME/hub)', () => {
    const rel = path.join(FIXTURES, 'rl.toml');
    const r = cli(['rl', '@', rel, '--dry-run'], { HF_HUB_CACHE: cache });
    expect(r.code).toBe(0);
    expect(r.stderr).toMatch(
      new RegExp(
        `model\\.name = "PrimeIntellect/Qwen3-0\\.6B" -> ${cache}/models--PrimeIntellect--Qwen3-0\\.6B/snapshots/[0-9a-f]{40}`,
      ),
    );
    fs.mkdirSync(path.join(dir, 'home'), { recursive: true });
    fs.renameSync(cache, path.join(dir, 'home', 'hub'));
    try {
      const home = cli(['rl', '@', rel, '--dry-run'], { HF_HOME: path.join(dir, 'home') });
      expect(home.stderr).toContain(
        `-> ${path.join(dir, 'home', 'hub')}/models--PrimeIntellect--Qwen3-0.6B/snapshots/`,
      );
    } finally {
      fs.renameSync(path.join(dir, 'home', 'hub'), cache);
    }
  });

  test.each(['rl', 'sft', 'eval'])(
    '%s: a name found nowhere exits 2 before anything starts, saying where it looked and how to download it',
    (name) => {
      const r = cli([name, '@', path.join(FIXTURES, `${name}.toml`), '--output-dir', path.join(dir, 'out')], {
        HF_HUB_CACHE: path.join(dir, 'empty-hub'),
      });
      expect(r.code).toBe(2);
      expect(r.stderr).toContain(
        'model.name: PrimeIntellect/Qwen3-0.6B is not a folder and not in the local Hugging Face cache',
      );
      expect(r.stderr).toContain(path.join(dir, 'empty-hub', 'models--PrimeIntellect--Qwen3-0.6B'));
      expect(r.stderr).toContain('hf download PrimeIntellect/Qwen3-0.6B');
      // Nothing was started: no run folder.
      expect(fs.existsSync(path.join(dir, 'out'))).toBe(false);
    },
  );

  test('a revision that would lead out of the cache exits 2 before anything starts, printing nothing from there', () => {
    // refs/../../../secret.txt is the file above the cache: its content was printed as the commit.
    const secret = path.join(dir, 'secret.txt');
    fs.writeFileSync(secret, 'TOPSECRET\n');
    const r = cli(
      ['rl', '--model.name', 'PrimeIntellect/Qwen3-0.6B@../../../secret.txt', '--output-dir', path.join(dir, 'out')],
      {
        HF_HUB_CACHE: cache,
      },
    );
    expect(r.code).toBe(2);
    expect(r.stderr).toBe(
      "error: model.name: PrimeIntellect/Qwen3-0.6B@...: the revision \"../../../secret.txt\" is not a branch, tag or commit name (names separated by '/', none of them '.' or '..')\n",
    );
    expect(fs.existsSync(path.join(dir, 'out'))).toBe(false);
  });

  test('a dataset name found nowhere names the dataset command', () => {
    const r = cli(['sft', '@', path.join(FIXTURES, 'sft.toml'), '--output-dir', path.join(dir, 'out')], {
      HF_HUB_CACHE: cache,
    });
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('data.name: willcb/R1-reverse-wikipedia-paragraphs-v1-1000 is not a folder');
    expect(r.stderr).toContain('hf download willcb/R1-reverse-wikipedia-paragraphs-v1-1000 --repo-type dataset');
  });
});

test('an empty table of a setting that is ours anyway ([deployment], [orchestrator.algo]) is no refusal', () => {
  const c = loadText<RLConfig>('rl', `${BASE.rl}[deployment]\n[orchestrator.algo]\n[trainer]\n`, MODEL);
  expect(c.trainer.world_size).toBe(1);
});
