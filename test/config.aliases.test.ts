/** The Python prime-rl's documented config keys, mapped onto ours (lib/config/aliases.ts). */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { aliasesHelp, RL_ALIASES } from '../lib/config/aliases';
import { ConfigError } from '../lib/config/errors';
import { loadConfig } from '../lib/config/loader';
import { RL_SECTIONS, RL_SHARED_KEYS, rlSchema } from '../lib/config/schemas';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-aliases-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const documented = fs.readFileSync(path.join(__dirname, '..', 'configs', 'prime-rl', 'documented.toml'), 'utf8');
/** The documented config without the two sections that other work adds (see the last test). */
const withoutFilterAndKl = documented.replace(/\[difficulty_filter\][^[]*/, '').replace(/\[kl_penalty\][^[]*/, '');

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

function configError(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as Error).message;
  }
  throw new Error('expected a ConfigError');
}

test('the documented config loads unchanged and every key lands on ours', () => {
  const { config: c, mapped } = load(['@', file('doc.toml', withoutFilterAndKl)]);
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

// INTEGRATOR: passes once orchestrator.difficulty_filter and trainer.kl_penalty exist (other branches).
test('the documented config with [difficulty_filter] and [kl_penalty]', () => {
  const c = load(['@', file('full.toml', documented)]).config as unknown as {
    orchestrator: { difficulty_filter: unknown };
    trainer: { kl_penalty: unknown };
  };
  expect(c.orchestrator.difficulty_filter).toEqual({
    enabled: true,
    min_reward_variance: 0.1,
    max_reward: 0.95,
    min_reward: 0.05,
  });
  expect(c.trainer.kl_penalty).toEqual({ enabled: true, target_kl: 0.01, beta: 0.1 });
});
