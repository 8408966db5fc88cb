import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fieldAt } from '../../lib/config/introspect';
import { loadConfig, MAX_CONFIG_FILE_BYTES } from '../../lib/config/loader';
import { isFrameworkVariable } from '../../lib/config/variables';
import {
  RL_SECTIONS,
  RL_SHARED_KEYS,
  evalSchema,
  rlSchema,
  sftSchema,
  modelCreateSchema,
} from '../../lib/config/schemas';
import { POLICY_LOSSES } from '../../native/loss-kinds';
import { configError } from '../support/config-error';
import { scratchDir } from '../support/setup';

const { dir, file } = scratchDir('prime-config-');

const shared = { keys: RL_SHARED_KEYS, sections: RL_SECTIONS };
const rl = (argv: string[], env: NodeJS.ProcessEnv = {}) =>
  loadConfig({ schema: rlSchema, argv: ['--model.name', 'm', ...argv], env, cwd: dir, shared }).config;
const sft = (argv: string[], env: NodeJS.ProcessEnv = {}) =>
  loadConfig({ schema: sftSchema, argv: ['--model.name', 'm', ...argv], env, cwd: dir }).config;

describe('precedence: CLI > files > env > defaults', () => {
  const toml = file('lr.toml', '[optim]\nlr = 2e-5\n');
  const env = { PRIME_OPTIM__LR: '3e-5' };

  test('defaults alone', () => expect(sft([]).optim.lr).toBe(1e-6));
  test('env beats defaults', () => expect(sft([], env).optim.lr).toBe(3e-5));
  test('file beats defaults', () => expect(sft(['@', toml]).optim.lr).toBe(2e-5));
  test('file beats env', () => expect(sft(['@', toml], env).optim.lr).toBe(2e-5));
  test('CLI beats defaults', () => expect(sft(['--optim.lr', '4e-5']).optim.lr).toBe(4e-5));
  test('CLI beats env', () => expect(sft(['--optim.lr', '4e-5'], env).optim.lr).toBe(4e-5));
  test('CLI beats file, wherever it stands on the line', () => {
    expect(sft(['--optim.lr', '4e-5', '@', toml]).optim.lr).toBe(4e-5);
    expect(sft(['@', toml, '--optim.lr', '4e-5'], env).optim.lr).toBe(4e-5);
  });
  test('a default that depends on another key (lr with LoRA)', () => {
    expect(sft(['--lora.enabled']).optim.lr).toBe(1e-5);
    expect(sft(['--lora.enabled', '--optim.lr', '7e-6']).optim.lr).toBe(7e-6);
  });
});

describe('files', () => {
  test('several files: later wins, tables merge deeply, arrays are replaced', () => {
    const a = file(
      'a.toml',
      'seq_len = 512\n[optim]\nlr = 1e-5\nweight_decay = 0.1\n[data]\nloss_roles = ["assistant", "tool"]\n',
    );
    const b = file('b.toml', '[optim]\nlr = 2e-5\n[data]\nloss_roles = ["user"]\n');
    const c = sft(['@', a, '@', b]);
    expect(c.seq_len).toBe(512);
    expect(c.optim).toMatchObject({ lr: 2e-5, weight_decay: 0.1 });
    expect(c.data.loss_roles).toEqual(['user']);
  });

  test('@path without a space, relative to the working directory', () => {
    file('rel.toml', 'seq_len = 64\n');
    expect(sft(['@rel.toml']).seq_len).toBe(64);
  });

  test('a file scoped to one section of the rl config', () => {
    const t = file('trainer.toml', 'threads = 4\n[optim]\nlr = 5e-6\n');
    const c = rl(['--trainer', '@', t]);
    expect(c.trainer.threads).toBe(4);
    expect(c.trainer.optim.lr).toBe(5e-6);
    expect(rl(['--trainer', `@${t}`]).trainer.threads).toBe(4);
  });

  test('arrays of tables ([[env]])', () => {
    const e = file(
      'env.toml',
      '[[env]]\nid = "reverse-text"\nweight = 2\n[[env]]\nid = "arithmetic"\nargs = { digits = 3 }\n',
    );
    expect(rl(['@', e]).env).toEqual([
      { id: 'reverse-text', args: {}, weight: 2 },
      { id: 'arithmetic', args: { digits: 3 }, weight: 1 },
    ]);
  });
});

describe('CLI values', () => {
  test('kebab and snake case', () => {
    expect(sft(['--optim.max-norm', '0.5']).optim.max_norm).toBe(0.5);
    expect(sft(['--optim.max_norm', '0.5']).optim.max_norm).toBe(0.5);
    expect(sft(['--optim.max-norm=0.25']).optim.max_norm).toBe(0.25);
  });
  test('--flag, --no-flag, --flag false', () => {
    expect(sft(['--lora.enabled']).lora.enabled).toBe(true);
    expect(sft(['--lora.enabled', '--no-lora.enabled']).lora.enabled).toBe(false);
    expect(sft(['--lora.enabled', '--lora.no-enabled']).lora.enabled).toBe(false);
    expect(sft(['--lora.enabled', 'false']).lora.enabled).toBe(false);
  });
  test('lists: space separated, comma separated, JSON', () => {
    expect(sft(['--data.loss-roles', 'assistant', 'tool']).data.loss_roles).toEqual(['assistant', 'tool']);
    expect(sft(['--data.loss-roles', 'assistant,tool']).data.loss_roles).toEqual(['assistant', 'tool']);
    expect(sft(['--data.loss-roles', '["tool"]']).data.loss_roles).toEqual(['tool']);
    expect(sft(['--optim.betas', '0.8,0.95']).optim.betas).toEqual([0.8, 0.95]);
  });
  test('JSON values for objects and lists of objects', () => {
    expect(rl(['--env', '[{"id": "arithmetic", "args": {"digits": 2}}]']).env).toEqual([
      { id: 'arithmetic', args: { digits: 2 }, weight: 1 },
    ]);
    expect(sft(['--data.env', '{"id": "reverse-text"}']).data.env).toEqual({ id: 'reverse-text', args: {}, weight: 1 });
  });
  test('negative numbers are values, not options', () => {
    expect(rl(['--orchestrator.sampling.top-k', '-1']).orchestrator.sampling.top_k).toBe(-1);
  });
});

describe('environment variables', () => {
  test('PRIME_A__B nests, and values are typed by the schema', () => {
    const c = rl([], {
      PRIME_TRAINER__OPTIM__MAX_NORM: '0.5',
      PRIME_TRAINER__LORA__ENABLED: 'true',
      PRIME_SEQ_LEN: '128',
    });
    expect(c.trainer.optim.max_norm).toBe(0.5);
    expect(c.trainer.lora.enabled).toBe(true);
    expect(c.seq_len).toBe(128);
  });
  test("another command's variables are left to it; one no command can take is an error naming it", () => {
    const others = [sftSchema, evalSchema];
    const rlWith = (env: NodeJS.ProcessEnv) =>
      loadConfig({ schema: rlSchema, argv: ['--model.name', 'm'], env, cwd: dir, shared, otherSchemas: others });
    // sft's data.* and the framework's own variables: not rl's, fine (sft reads data.name).
    expect(() =>
      rlWith({ PRIME_DATA__NAME: 'Org/Data', PRIME_SETUP: '0', PRIME_BENCH_DEVICE: 'cpu', PRIMEX: '2' }),
    ).not.toThrow();
    // Used to be ignored silently, by every command.
    expect(configError(() => rlWith({ PRIME_SOMETHING_ELSE: '1' }))).toMatch(
      /^environment variable PRIME_SOMETHING_ELSE: no command has a config key 'something_else'/,
    );
    expect(configError(() => rlWith({ PRIME___PROTO____X: '1' }))).toMatch(
      /^environment variable PRIME___PROTO____X: no command has a config key ''/,
    );
    // For sft, but sft has no such key, or could not parse the value: it would fail there.
    expect(configError(() => rlWith({ PRIME_DATA__NAMEE: 'x' }))).toMatch(
      /unknown config key 'data\.namee' \(environment variable PRIME_DATA__NAMEE\)/,
    );
    expect(configError(() => rlWith({ PRIME_DATA__NUM_EXAMPLES: 'many' }))).toBe(
      "data.num_examples (environment variable PRIME_DATA__NUM_EXAMPLES): expected a number, got 'many'",
    );
    // rl's own, unparsable (it was, and stays, an error for rl; inference left it alone silently).
    const bad = { PRIME_ORCHESTRATOR__SAMPLING__STOP: '["a",' };
    expect(configError(() => rlWith(bad))).toMatch(
      /^orchestrator\.sampling\.stop \(environment variable PRIME_ORCHESTRATOR__SAMPLING__STOP\): expected JSON/,
    );
    expect(
      configError(() =>
        loadConfig({ schema: sftSchema, argv: ['--model.name', 'm'], env: bad, otherSchemas: [rlSchema] }),
      ),
    ).toMatch(
      /^orchestrator\.sampling\.stop \(environment variable PRIME_ORCHESTRATOR__SAMPLING__STOP\): expected JSON/,
    );
  });
  test("every PRIME_ variable the code reads is config or one of the framework's own (variables.ts)", () => {
    const root = path.join(__dirname, '..', '..');
    const files = execFileSync(
      'git',
      ['ls-files', 'lib', 'native/*.ts', 'bench', 'workers', 'activities', 'workflows', 'scripts', 'bin', 'test'],
      { cwd: root, encoding: 'utf8' },
    )
      .split('\n')
      .filter((f) => /\.(ts|js|sh)$/.test(f));
    const read = new Map<string, string>();
    for (const f of files) {
      const text = fs.readFileSync(path.join(root, f), 'utf8');
      // Read from an environment: env.X, env['X'], $X and ${X} in scripts, a name held in a constant.
      for (const m of text.matchAll(/(?:env(?:\.|\[')|\$\{?|_ENV = ')(PRIME_[A-Z0-9_]*[A-Z0-9])/g))
        if (!m[1].includes('__')) read.set(m[1], f);
    }
    const schemas = [rlSchema, sftSchema, evalSchema];
    const stray = [...read].filter(
      ([name]) =>
        !isFrameworkVariable(name) && !schemas.some((s) => fieldAt(s, [name.slice('PRIME_'.length).toLowerCase()])),
    );
    expect(read.size).toBeGreaterThan(10); // the scan finds them
    expect(stray).toEqual([]);
  });
  test('a wrong key under a known section is an error naming the variable', () => {
    const msg = configError(() => rl([], { PRIME_TRAINER__OPTIM__LRR: '1' }));
    expect(msg).toContain('PRIME_TRAINER__OPTIM__LRR');
    expect(msg).toContain("Did you mean 'trainer.optim.lr'");
  });
});

describe('shared keys of rl', () => {
  test('fill trainer, orchestrator and inference', () => {
    const c = rl(['--seq-len', '300', '--max-steps', '7', '--async-level', '2', '--seed', '5', '--output-dir', 'out']);
    for (const s of [c.trainer, c.orchestrator, c.inference]) {
      expect(s.model.name).toBe('m');
      expect(s.seq_len).toBe(300);
      expect(s.output_dir).toBe('out');
      expect(s.seed).toBe(5);
    }
    expect(c.trainer.max_steps).toBe(7);
    expect(c.orchestrator.max_steps).toBe(7);
    expect(c.orchestrator.async_level).toBe(2);
  });
  test('defaults fill the sections too', () => {
    const c = rl([]);
    expect(c.output_dir).toBe('outputs');
    expect([c.trainer.output_dir, c.orchestrator.output_dir, c.inference.output_dir]).toEqual([
      'outputs',
      'outputs',
      'outputs',
    ]);
  });
  test('a value set only in one section is the run value', () => {
    const c = loadConfig({ schema: rlSchema, argv: ['--trainer.model.name', 'x'], env: {}, shared }).config;
    expect([c.model.name, c.inference.model.name, c.orchestrator.model.name]).toEqual(['x', 'x', 'x']);
  });
  test('an equal explicit value in a section is fine; a different one is an error naming both', () => {
    expect(rl(['--seq-len', '64', '--trainer.seq-len', '64']).trainer.seq_len).toBe(64);
    const t = file('conflict.toml', '[trainer]\nseq_len = 128\n');
    const msg = configError(() => rl(['--seq-len', '64', '@', t]));
    expect(msg).toContain("shared key 'seq_len'");
    expect(msg).toContain('seq_len = 64 (from --seq-len)');
    expect(msg).toContain(`trainer.seq_len = 128 (in ${t})`);
  });
  test('model.name is required once', () => {
    const msg = configError(() => loadConfig({ schema: rlSchema, argv: [], env: {}, shared }));
    expect(msg).toContain("missing required key 'model.name'");
  });
});

describe('errors', () => {
  test('unknown CLI key, with the nearest valid key', () => {
    const msg = configError(() => rl(['--trainer.optim.lrr', '1']));
    expect(msg).toContain("unknown config key 'trainer.optim.lrr'");
    expect(msg).toContain("Did you mean 'trainer.optim.lr'");
    expect(configError(() => rl(['--no-such-key', '1']))).toContain("'no_such_key'");
  });
  test('unknown key in a file names the file', () => {
    const t = file('typo.toml', '[trainer.optim]\nweight_decy = 0.1\n');
    const msg = configError(() => rl(['@', t]));
    expect(msg).toContain(`in ${t}`);
    expect(msg).toContain("Did you mean 'trainer.optim.weight_decay'");
  });
  test('unknown key in a section-scoped file names the full key', () => {
    const t = file('scoped-typo.toml', 'thread = 2\n');
    expect(configError(() => rl(['--trainer', '@', t]))).toContain("'trainer.thread'");
  });
  test('wrong types', () => {
    expect(configError(() => rl(['--seq-len', 'many']))).toContain(
      "seq_len (from --seq-len): expected a number, got 'many'",
    );
    expect(configError(() => rl(['--seq-len', '1.5']))).toMatch(/seq_len: .*int.*\(from --seq-len\)/);
    expect(configError(() => rl(['--trainer.lora.enabled=maybe']))).toContain('expected true or false');
    const t = file('types.toml', 'seq_len = "long"\n');
    expect(configError(() => rl(['@', t]))).toMatch(
      new RegExp(`seq_len: .*expected number.*\\(in ${t.replace(/[.]/g, '\\.')}\\)`),
    );
    expect(configError(() => rl(['--trainer.loss.type', 'ppo']))).toMatch(
      new RegExp(`trainer\\.loss\\.type: .*${POLICY_LOSSES.map((n) => `"${n}"`).join('\\|')}`),
    );
    expect(configError(() => rl(['--env', '{not json']))).toContain('expected JSON');
  });
  test('a key that needs another names both', () => {
    expect(configError(() => sft(['--val.target-loss', '0.1']))).toMatch(
      /val\.target_loss: needs val\.interval.*\(from --val\.target-loss\)/,
    );
    expect(sft(['--val.target-loss', '0.1', '--val.interval', '10']).val.target_loss).toBe(0.1);
  });
  test('configs that cannot train are refused, naming the keys and a fix', () => {
    expect(configError(() => rl(['--orchestrator.batch-size', '10', '--orchestrator.rollouts-per-example', '4']))).toBe(
      'invalid configuration:\n  orchestrator.batch_size: 10 is not a multiple of orchestrator.rollouts_per_example (4): a step samples ' +
        'batch_size / rollouts_per_example examples, each rollouts_per_example times; use e.g. 8 or 12 (from --orchestrator.batch-size)',
    );
    expect(configError(() => rl(['--orchestrator.rollouts-per-example', '3']))).toMatch(
      /^invalid configuration:\n  orchestrator\.batch_size: 128 is not a multiple of orchestrator\.rollouts_per_example \(3\).*use e\.g\. 126 or 129$/,
    );
    // max_tokens = seq_len is "up to the context" (each turn still gets what seq_len leaves); above it, never reached.
    expect(rl(['--seq-len', '64', '--orchestrator.sampling.max-tokens', '64']).orchestrator.sampling.max_tokens).toBe(
      64,
    );
    expect(configError(() => rl(['--seq-len', '64', '--orchestrator.sampling.max-tokens', '65']))).toBe(
      'invalid configuration:\n  orchestrator.sampling.max_tokens: 65 is above orchestrator.seq_len (64): prompt + completion must fit in ' +
        'orchestrator.seq_len, so no turn could reach it; lower max_tokens to at most 64 or raise orchestrator.seq_len (from --orchestrator.sampling.max-tokens)',
    );
    expect(configError(() => rl(['--seq-len', '64', '--eval.sampling.max-tokens', '100']))).toMatch(
      /^invalid configuration:\n  eval\.sampling\.max_tokens: 100 is above orchestrator\.seq_len \(64\)/,
    );
    const evalCfg = (argv: string[]) =>
      loadConfig({ schema: evalSchema, argv: ['--model.name', 'm', ...argv], env: {} }).config;
    expect(configError(() => evalCfg(['--seq-len', '32', '--sampling.max-tokens', '33']))).toMatch(
      /^invalid configuration:\n  sampling\.max_tokens: 33 is above seq_len \(32\)/,
    );
    // An external API has its own context: seq_len does not bound it.
    expect(
      evalCfg(['--seq-len', '32', '--sampling.max-tokens', '32', '--client.base-url', 'http://api.example/v1']).sampling
        .max_tokens,
    ).toBe(32);
    expect(
      rl([
        '--seq-len',
        '64',
        '--orchestrator.sampling.max-tokens',
        '63',
        '--orchestrator.batch-size',
        '12',
        '--orchestrator.rollouts-per-example',
        '4',
      ]).orchestrator.batch_size,
    ).toBe(12);
  });
  test('TOML syntax error names file, line and column', () => {
    const t = file('broken.toml', 'seq_len = 12\n[trainer\nlr = 1\n');
    const msg = configError(() => rl(['@', t]));
    expect(msg).toMatch(new RegExp(`TOML syntax error in ${t.replace(/[.]/g, '\\.')} at line 2, column \\d+`));
  });
  test('missing file', () => {
    expect(configError(() => rl(['@', 'nope.toml']))).toBe('config file not found: nope.toml');
  });
  test('a device, a FIFO or a huge file is refused before it is read', () => {
    // /dev/zero used to be read until memory ran out.
    expect(configError(() => rl(['@', '/dev/zero']))).toBe(
      'config file /dev/zero is not a regular file (a character device)',
    );
    const fifo = path.join(dir, 'fifo.toml');
    execFileSync('mkfifo', [fifo]); // reading a FIFO without a writer would wait for ever
    expect(configError(() => rl(['@', fifo]))).toBe(`config file ${fifo} is not a regular file (a FIFO)`);
    expect(configError(() => rl(['@', dir]))).toBe(`config file ${dir} is not a regular file (a folder)`);
    const big = path.join(dir, 'big.toml');
    fs.writeFileSync(big, '');
    fs.truncateSync(big, MAX_CONFIG_FILE_BYTES + (4 << 20)); // sparse: nothing written
    expect(configError(() => rl(['@', big]))).toBe(`config file ${big} is 20 MiB, more than the 16 MiB allowed`);
  });
  test('a config nested deeper than 64 levels is refused naming the key and where it came from', () => {
    // 2,000 deep it exited 1 with a stack trace from the alias mapping.
    const deepKey = Array.from({ length: 2000 }, () => 'a').join('.');
    const toml = file('deep.toml', `[${deepKey}]\nx = 1\n`);
    expect(configError(() => rl(['@', toml]))).toBe(
      `config file ${toml}: a.a.a.a.a.a... nests deeper than 64 levels (tables and lists inside each other), more than any config needs`,
    );
    const json = file('deep.json', `{"env": ${'['.repeat(3000)}${']'.repeat(3000)}}`);
    expect(configError(() => rl(['@', json]))).toMatch(
      new RegExp(`^config file ${json}: env\\.0\\.0\\.0\\.0\\.0\\.\\.\\. nests deeper`),
    );
    expect(configError(() => rl(['--env', `${'['.repeat(100)}${']'.repeat(100)}`]))).toMatch(
      /^env \(from --env\): env\.0\.0\.0\.0\.0\.\.\. nests deeper than 64 levels/,
    );
    // A deep but reasonable one loads.
    expect(rl(['@', file('ok.toml', '[trainer.optim]\nlr = 1e-5\n')]).trainer.optim.lr).toBe(1e-5);
  });
  test('a scoped file needs a section', () => {
    const t = file('x.toml', 'a = 1\n');
    expect(configError(() => rl(['--seq-len', '@', t]))).toContain("'seq_len' is not a section");
  });
  test('a required key without a value', () => {
    expect(configError(() => loadConfig({ schema: modelCreateSchema, argv: [], env: {} }))).toContain('out: required');
  });
  test('an option without its value', () => {
    expect(configError(() => rl(['--seq-len']))).toContain('--seq-len needs a value');
  });
});

describe('in-flight mode refuses what it cannot honour, naming the key', () => {
  const inFlight = ['--orchestrator.in-flight.enabled', 'true', '--env', '[{"id": "reverse-text"}]'];
  test('evals between steps', () => {
    expect(configError(() => rl([...inFlight, '--eval.interval', '2']))).toMatch(/eval\.interval.*in_flight/s);
  });
  test('a verifiers environment is taken: its tokens get their versions from the server that sampled them', () => {
    const c = rl([...inFlight.slice(0, 2), '--env', '[{"id": "verifiers:reverse_words"}]']);
    expect(c.orchestrator.in_flight.enabled).toBe(true);
  });
  test('strict mode takes both', () => {
    expect(rl(['--env', '[{"id": "verifiers:reverse_words"}]', '--eval.interval', '2']).eval.interval).toBe(2);
  });
});

describe('model device and dtype', () => {
  test('cpu, cuda and cuda:N; trainer and inference each on their own GPU', () => {
    expect(sft(['--model.device', 'cuda:1', '--model.dtype', 'bfloat16']).model).toMatchObject({
      device: 'cuda:1',
      dtype: 'bfloat16',
    });
    const c = rl(['--trainer.model.device', 'cuda:0', '--inference.model.device', 'cuda:1']);
    expect([c.trainer.model.device, c.inference.model.device]).toEqual(['cuda:0', 'cuda:1']);
  });
  test('activation checkpointing: [model.ac] for the trained model, absent = off; not an inference setting', () => {
    expect(sft([]).model.ac).toBeUndefined();
    expect(sft(['--model.ac.freq', '2']).model.ac).toEqual({ freq: 2 });
    const toml = file('ac.toml', '[trainer.model.ac]\n');
    expect(rl(['@', toml]).trainer.model.ac).toEqual({ freq: 1 });
    expect(configError(() => rl(['--inference.model.ac.freq', '1']))).toMatch(/inference\.model\.ac/);
    expect(configError(() => sft(['--model.ac.freq', '0']))).toMatch(/model\.ac\.freq/);
  });
  test('fused kernels: a switch of the trained model, off by default, refused on the CPU and for inference', () => {
    expect(sft([]).model.fused_kernels).toBe(false);
    expect(sft(['--model.device', 'cuda', '--model.fused-kernels', 'true']).model.fused_kernels).toBe(true);
    expect(
      rl(['--trainer.model.device', 'cuda:1', '--trainer.model.fused-kernels', 'true']).trainer.model,
    ).toMatchObject({ device: 'cuda:1', fused_kernels: true });
    const msg = configError(() => sft(['--model.fused-kernels', 'true']));
    expect(msg).toMatch(/model\.fused_kernels/);
    expect(msg).toMatch(/set the model's device to cuda/);
    expect(configError(() => rl(['--inference.model.fused-kernels', 'true']))).toMatch(
      /inference\.model\.fused_kernels/,
    );
  });
  test('another device is refused, naming the key', () => {
    const msg = configError(() => sft(['--model.device', 'gpu']));
    expect(msg).toMatch(/model\.device/);
    expect(msg).toMatch(/'cpu', 'cuda' or 'cuda:N'/);
  });
});
