/** The Python prime-rl's documented config keys, mapped onto ours (lib/config/aliases.ts). */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { aliasesHelp, findAlias, RL_ALIASES } from '../lib/config/aliases';
import { loadConfig } from '../lib/config/loader';
import { RL_SECTIONS, RL_SHARED_KEYS, rlSchema } from '../lib/config/schemas';
import { projectRoot } from '../lib/paths';
import { configError } from './support/config-error';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-aliases-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const DOCUMENTED = path.join('configs', 'prime-rl', 'documented.toml');
const documented = fs.readFileSync(path.join(projectRoot, DOCUMENTED), 'utf8');

function file(name: string, text: string): string {
  const p = path.join(dir, name);
  fs.writeFileSync(p, text);
  return p;
}
const load = (argv: string[]) =>
  loadConfig({
    schema: rlSchema,
    argv,
    env: {},
    cwd: dir,
    shared: { keys: RL_SHARED_KEYS, sections: RL_SECTIONS },
    aliases: RL_ALIASES,
  });

test('the documented config loads unchanged and every key lands on ours', () => {
  const { config: c, mapped } = load(['@', file('doc.toml', documented)]);
  expect(c.model.name).toBe('outputs/models/x');
  expect([c.trainer.model.name, c.orchestrator.model.name, c.inference.model.name]).toEqual(
    Array(3).fill('outputs/models/x'),
  );
  expect(c.max_steps).toBe(500);
  expect(c.orchestrator).toMatchObject({ batch_size: 256, rollouts_per_example: 8 });
  expect(c.trainer.optim.lr).toBe(1e-5);
  expect(c.trainer.scheduler.warmup_steps).toBe(100);
  expect(c.orchestrator.sampling).toMatchObject({
    max_tokens: 512,
    temperature: 0.7,
    top_p: 0.9,
    stop: ['<|endoftext|>'],
  });
  expect(c.env).toEqual([{ id: 'reverse-text', args: { max_words: 2 }, weight: 0.5 }]);
  expect(c.trainer.lora).toEqual({
    enabled: true,
    rank: 64,
    alpha: 16,
    dropout: 0.05,
    target_modules: ['q_proj', 'v_proj', 'k_proj', 'o_proj'],
  });
  expect(c.wandb).toEqual({ project: 'my-project', name: 'my-run' });
  expect(c.orchestrator.difficulty_filter).toEqual({
    enabled: true,
    min_reward_variance: 0.1,
    max_reward: 0.95,
    min_reward: 0.05,
  });
  expect(c.trainer.kl_penalty).toEqual({ enabled: true, target_kl: 0.01, beta: 0.1 });
  // What --dry-run lists: each documented key, its value and where it went.
  expect(mapped.map((m) => `${m.from}->${m.to}`)).toEqual(
    expect.arrayContaining([
      'model->model.name',
      'lora.r->trainer.lora.rank',
      'learning_rate->trainer.optim.lr',
      'gradient_accumulation_steps->null',
    ]),
  );
});

test('two spellings of one key in one file: an error naming both', () => {
  const f = file('both.toml', 'learning_rate = 1e-5\n[trainer.optim]\nlr = 2e-5\n');
  expect(configError(() => load(['--model.name', 'm', '@', f]))).toMatch(
    /learning_rate = 0\.00001 and trainer\.optim\.lr = 0\.00002 both set trainer\.optim\.lr/,
  );
  const g = file('lora.toml', '[lora]\nr = 8\n[trainer.lora]\nrank = 4\n');
  expect(configError(() => load(['--model.name', 'm', '@', g]))).toMatch(/lora\.r = 8 and trainer\.lora\.rank = 4/);
  // The same value twice is no conflict.
  expect(
    load(['--model.name', 'm', '@', file('same.toml', 'batch_size = 16\n[orchestrator]\nbatch_size = 16\n')]).config
      .orchestrator.batch_size,
  ).toBe(16);
});

test('documented flags on the command line, and their conflicts', () => {
  const c = load([
    '--model',
    'tiny',
    '--learning-rate',
    '3e-6',
    '--lora.r',
    '8',
    '--sampling.stop',
    'a,b',
    '--batch-size',
    '16',
    '--rollouts-per-example',
    '4',
  ]).config;
  expect(c.model.name).toBe('tiny');
  expect(c.trainer.optim.lr).toBe(3e-6);
  expect(c.trainer.lora.rank).toBe(8);
  expect(c.orchestrator.sampling.stop).toEqual(['a', 'b']);
  expect(c.orchestrator.batch_size).toBe(16);
  expect(configError(() => load(['--model', 'm', '--learning-rate', '1e-5', '--trainer.optim.lr', '2e-5']))).toMatch(
    /conflicting keys on the command line: learning_rate = 0\.00001 and trainer\.optim\.lr = 0\.00002/,
  );
  // Across sources the usual precedence holds: the command line beats a file.
  expect(
    load(['--model.name', 'm', '@', file('lr.toml', 'learning_rate = 1e-5\n'), '--trainer.optim.lr', '2e-5']).config
      .trainer.optim.lr,
  ).toBe(2e-5);
});

test('gradient_accumulation_steps is checked; a bad documented value names its key', () => {
  expect(
    configError(() => load(['--model.name', 'm', '@', file('ga.toml', 'gradient_accumulation_steps = 0\n')])),
  ).toMatch(/gradient_accumulation_steps .*positive integer/);
  expect(configError(() => load(['--model.name', 'm', '@', file('t.toml', '[sampling]\ntemperature = -1\n')]))).toMatch(
    /orchestrator\.sampling\.temperature/,
  );
});

test('--help documents every documented key', () => {
  const help = aliasesHelp(RL_ALIASES);
  for (const a of RL_ALIASES) expect(help).toContain(a.table ? `[${a.from}]` : a.from);
  expect(help).toContain('r -> rank');
});

/** The CLI as users run it (the compiled bin/prime-rl.js, as test/cli.test.ts runs it). */
function cli(args: string[]) {
  const r = spawnSync(process.execPath, [path.join(projectRoot, 'bin', 'prime-rl.js'), ...args], {
    cwd: projectRoot,
    env: { PATH: process.env.PATH },
    encoding: 'utf8',
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Dotted leaf keys of a TOML table (arrays of tables and plain arrays are leaves). */
function leafKeys(tree: Record<string, unknown>, prefix = ''): string[] {
  return Object.entries(tree).flatMap(([k, v]) =>
    typeof v === 'object' && v !== null && !Array.isArray(v)
      ? leafKeys(v as Record<string, unknown>, `${prefix}${k}.`)
      : [`${prefix}${k}`],
  );
}

test('rl @ documented.toml --dry-run: every key of the file is listed where it went, or is one of ours', () => {
  const r = cli(['rl', '@', DOCUMENTED, '--dry-run']);
  expect(r.stderr).not.toMatch(/error/i);
  expect(r.code).toBe(0);
  const resolved = JSON.parse(r.stdout) as Record<string, unknown>;
  const tree = parseToml(documented) as Record<string, unknown>;
  const keys = leafKeys(tree);
  expect(keys).toHaveLength(26);
  for (const key of keys) {
    const hit = findAlias(RL_ALIASES, key);
    if (hit) {
      const value = key.split('.').reduce<unknown>((t, k) => (t as Record<string, unknown>)[k], tree);
      expect(r.stderr).toContain(
        `  ${key} = ${JSON.stringify(value)} -> ${hit.to ?? '(nothing to set)'} (in ${DOCUMENTED})\n`,
      );
    } else {
      // Not a documented alias: the key is ours, and the resolved config holds the file's value.
      expect(['max_steps', 'env', 'wandb.project', 'wandb.name']).toContain(key);
      const [top, sub] = key.split('.');
      const want = sub ? (tree[top] as Record<string, unknown>)[sub] : tree[top];
      const got = sub ? (resolved[top] as Record<string, unknown>)[sub] : resolved[top];
      if (typeof want === 'object') expect(got).toMatchObject(want as object);
      else expect(got).toBe(want);
    }
  }
});

test('rl: a conflict exits 2 naming both keys; --help prints the documented keys', () => {
  const r = cli(['rl', '--model', 'm', '--learning-rate', '1e-5', '--trainer.optim.lr', '2e-5', '--dry-run']);
  expect(r.code).toBe(2);
  expect(r.stderr).toMatch(/learning_rate = 0\.00001 and trainer\.optim\.lr = 0\.00002 both set trainer\.optim\.lr/);
  const help = cli(['rl', '--help']);
  expect(help.code).toBe(0);
  expect(help.stdout).toContain(aliasesHelp(RL_ALIASES));
});
