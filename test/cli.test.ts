/** The CLI as users run it: the compiled `bin/prime-rl.js` in a child process (scripts/setup.sh builds dist/). */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { leaves } from '../lib/config/introspect';
import * as schemas from '../lib/config/schemas';
import { freePort } from '../lib/net';
import { projectRoot } from '../lib/paths';
import { lowercaseEnv, smallStep } from './support/setup';

/** `timeoutMs`: SIGTERM the command (the launcher then stops what it started) if it runs longer. */
function cli(args: string[], env: NodeJS.ProcessEnv = {}, timeoutMs?: number) {
  const r = spawnSync(process.execPath, [path.join(projectRoot, 'bin', 'prime-rl.js'), ...args], {
    cwd: projectRoot,
    env: { PATH: process.env.PATH, ...env },
    encoding: 'utf8',
    timeout: timeoutMs,
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

const kebab = (p: string[]) => `--${p.map((k) => k.replace(/_/g, '-')).join('.')}`;

test('--help lists every command', () => {
  const r = cli(['--help']);
  expect(r.code).toBe(0);
  for (const c of ['rl', 'sft', 'eval', 'inference', 'worker', 'model create', 'temporal start'])
    expect(r.stdout).toContain(c);
});

test.each([
  ['rl', schemas.rlSchema],
  ['sft', schemas.sftSchema],
  ['eval', schemas.evalSchema],
  ['inference', schemas.inferenceSchema],
  ['worker', schemas.workerSchema],
  ['model create', schemas.modelCreateSchema],
  ['temporal start', schemas.temporalCommandSchema],
])('%s --help shows every option of its schema with type and default', (name, schema) => {
  const r = cli([...name.split(' '), '--help']);
  expect(r.code).toBe(0);
  for (const { path: p } of leaves(schema)) expect(r.stdout).toContain(kebab(p));
  expect(r.stdout).toMatch(
    /--output-dir\s+string\s+"outputs"\s+root of run folders|--out\s+string\s+required\s+folder to write/,
  );
});

test.each(['rl', 'sft', 'eval'])('%s @ configs/debug/%s.toml --dry-run prints the resolved config', (name) => {
  const r = cli([name, '@', `configs/debug/${name}.toml`, '--dry-run']);
  expect(r.stderr).toBe('');
  expect(r.code).toBe(0);
  const config = JSON.parse(r.stdout);
  expect(config.run_name).toBe(`debug-${name}`);
  expect(config.seq_len).toBe(256);
  if (name === 'rl') {
    expect(config.trainer.model.name).toBe('outputs/models/debug-tiny');
    expect(config.inference.seq_len).toBe(256);
    expect(config.trainer.optim.lr).toBe(1e-4);
  }
});

test('--dry-run FILE also writes the resolved config', () => {
  const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'prime-cli-')), 'resolved.json');
  const r = cli(['rl', '@', 'configs/debug/rl.toml', '--dry-run', out]);
  expect(r.code).toBe(0);
  expect(JSON.parse(fs.readFileSync(out, 'utf8'))).toEqual(JSON.parse(r.stdout));
});

test("--dry-run prints the base URL the orchestrator will use: the run's server port, unless base_urls is set", () => {
  const moved = cli(['rl', '@', 'configs/debug/rl.toml', '--inference.server.port', '8401', '--dry-run']);
  expect(moved.code).toBe(0);
  expect(JSON.parse(moved.stdout).orchestrator.base_urls).toEqual(['http://127.0.0.1:8401/v1']);
  const wildcard = cli([
    'rl',
    '@',
    'configs/debug/rl.toml',
    '--inference.server.host',
    '0.0.0.0',
    '--inference.server.port',
    '8402',
    '--dry-run',
  ]);
  expect(JSON.parse(wildcard.stdout).orchestrator.base_urls).toEqual(['http://127.0.0.1:8402/v1']);
  // Servers started elsewhere: the explicit list wins.
  const remote = cli([
    'rl',
    '@',
    'configs/debug/rl.toml',
    '--inference.server.port',
    '8401',
    '--orchestrator.base-urls',
    'http://gpu1:8000/v1',
    'http://gpu2:8000/v1',
    '--dry-run',
  ]);
  expect(JSON.parse(remote.stdout).orchestrator.base_urls).toEqual(['http://gpu1:8000/v1', 'http://gpu2:8000/v1']);
  const any = cli(['rl', '@', 'configs/debug/rl.toml', '--inference.server.port', '0', '--dry-run']);
  expect(any.code).toBe(2);
  expect(any.stderr).toMatch(
    /inference\.server\.port: port 0 \(any free port\) leaves the orchestrator no address .* set orchestrator\.base_urls/,
  );
});

test('environment variables reach the config', () => {
  const r = cli(['rl', '@', 'configs/debug/rl.toml', '--dry-run'], { PRIME_TRAINER__OPTIM__WEIGHT_DECAY: '0.5' });
  expect(JSON.parse(r.stdout).trainer.optim.weight_decay).toBe(0.5);
});

test.each([
  [['rl', '--no-such-key', '1'], /unknown config key 'no_such_key'/],
  [['rl', '@', 'configs/debug/rl.toml', '--trainer.optim.lrr', '1'], /Did you mean 'trainer\.optim\.lr'/],
  [['rl', '@', 'configs/debug/missing.toml'], /config file not found: configs\/debug\/missing\.toml/],
  [
    ['rl', '@', 'configs/debug/rl.toml', '--seq-len', '64', '--trainer.seq-len', '32', '--dry-run'],
    /trainer\.seq_len = 32 \(from --trainer\.seq-len\) is below seq_len = 64/,
  ],
  [['rl', '@', 'configs/debug/rl.toml', '--max-steps', 'x'], /max_steps \(from --max-steps\): expected a number/],
  [
    ['rl', '@', 'configs/debug/rl.toml', '--orchestrator.batch-size', '10'],
    /orchestrator\.batch_size: 10 is not a multiple of orchestrator\.rollouts_per_example \(4\).*use e\.g\. 8 or 12/,
  ],
  [
    // Equal to seq_len is "up to the context" (prime-rl's max_completion_tokens); above it, never reached.
    ['rl', '@', 'configs/debug/rl.toml', '--orchestrator.sampling.max-tokens', '300', '--dry-run'],
    /orchestrator\.sampling\.max_tokens: 300 is above orchestrator\.seq_len \(256\)/,
  ],
  // These passed --dry-run, then failed with a stack trace once the launcher made the run folder.
  [
    ['rl', '@', 'configs/debug/rl.toml', '--output-dir', '/dev/null', '--dry-run'],
    /^ {2}output_dir: \/dev\/null exists and is not a folder \(from --output-dir\)$/m,
  ],
  [
    ['sft', '@', 'configs/debug/sft.toml', '--output-dir', '/dev/null/runs', '--dry-run'],
    /^ {2}output_dir: \/dev\/null is not a folder, so \/dev\/null\/runs cannot be made \(from --output-dir\)$/m,
  ],
  [
    ['rl', '@', 'configs/debug/rl.toml', '--run-name', 'r'.repeat(300), '--dry-run'],
    /^ {2}run_name: 300 characters; at most 128 \(it names a folder of output_dir and a workflow\) \(from --run-name\)$/m,
  ],
  // Used to die of V8 heap exhaustion listing 10^8 tensors.
  [
    ['model', 'create', '--out', path.join(os.tmpdir(), 'prime-never-made'), '--num-layers', '10000000'],
    /^error: num_layers: 10000000 makes [\d.]+ TiB of weights to hold while they are made, more than this machine's [\d.]+ GiB of memory$/m,
  ],
  [['evl'], /unknown command 'evl'. Did you mean 'eval'\?/],
  [['model', 'creat'], /Did you mean 'create'/],
])('bad input %j exits 2 and names the problem', (args, message) => {
  const r = cli(args as string[]);
  expect(r.code).toBe(2);
  expect(r.stderr).toMatch(message as RegExp);
  expect(r.stdout).toBe('');
});

test('a workflow that fails on bad input exits 2 with the activity and its reason, no stack', async () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-cli-fail-'));
  try {
    const model = path.join(out, 'model');
    expect(cli(['model', 'create', '--out', model]).code).toBe(0);
    const [port, uiPort, http] = [await freePort(), await freePort(), await freePort()];
    const r = cli([
      'eval',
      '--model.name',
      model,
      '--env',
      '[{"id": "no-such-env"}]',
      '--output-dir',
      out,
      '--temporal.port',
      String(port),
      '--temporal.ui-port',
      String(uiPort),
      '--server.port',
      String(http),
    ]);
    expect(r.stderr).toMatch(
      /error: Workflow execution failed: Activity task failed \(prepareEval\): unknown environment "no-such-env"/,
    );
    expect(r.stderr).not.toMatch(/\n\s+at /);
    expect(r.code).toBe(2);
  } finally {
    fs.rmSync(out, { recursive: true, force: true });
  }
});

test('an rl run whose seq_len cannot hold a prompt fails at its first step and exits 2 naming orchestrator.seq_len', async () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-cli-seq-'));
  try {
    const model = path.join(out, 'model');
    expect(cli(['model', 'create', '--out', model]).code).toBe(0);
    const [port, uiPort, http] = [await freePort(), await freePort(), await freePort()];
    const r = cli(
      [
        'rl',
        '@',
        'configs/debug/rl.toml',
        '--model.name',
        model,
        '--output-dir',
        out,
        '--seq-len',
        '8',
        '--orchestrator.sampling.max-tokens',
        '4',
        '--temporal.port',
        String(port),
        '--temporal.ui-port',
        String(uiPort),
        '--inference.server.port',
        String(http),
      ],
      {},
      90_000,
    );
    expect(r.stderr).toMatch(
      /error: Workflow execution failed: .*orchestrator\.seq_len \(8\) is too short for the environments' prompts/,
    );
    expect(r.code).toBe(2);
    expect(fs.existsSync(path.join(out, 'debug-rl', 'metrics.jsonl'))).toBe(false);
  } finally {
    fs.rmSync(out, { recursive: true, force: true });
  }
});

test("an rl run whose server refuses its weights (403) stops with the server's message and exits 2, not retrying forever", async () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-cli-403-'));
  try {
    const model = path.join(out, 'model');
    expect(cli(['model', 'create', '--out', model]).code).toBe(0);
    const [port, uiPort, http] = [await freePort(), await freePort(), await freePort()];
    // No orchestrator.base_urls: the orchestrator finds the server at --inference.server.port.
    // Step 2 samples from policy version 1, which the server may not load from output_dir.
    const r = cli(
      [
        'rl',
        '--model.name',
        model,
        '--env',
        lowercaseEnv,
        '--output-dir',
        out,
        '--temporal.port',
        String(port),
        '--temporal.ui-port',
        String(uiPort),
        '--inference.server.port',
        String(http),
        '--max-steps',
        '3',
        '--seq-len',
        '128',
        ...smallStep(8),
        '--inference.allowed-weight-roots',
        path.join(out, 'elsewhere'),
        '--trainer.threads',
        '1',
        '--inference.threads',
        '1',
      ],
      {},
      // A run that retries forever is stopped here (SIGTERM: the launcher stops its processes).
      240_000,
    );
    expect(r.stderr).toMatch(
      /error: Workflow execution failed: Activity task failed \(generateRollouts\): .*\/update_weights: HTTP 403: weight_dir: .*weights\/step_1 is outside the allowed roots/,
    );
    expect(r.stderr).not.toMatch(/\n\s+at /);
    expect(r.code).toBe(2);
  } finally {
    fs.rmSync(out, { recursive: true, force: true });
  }
}, 300_000);

test('a command that has nothing to do says so in one line and exits 1', async () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-cli-stop-'));
  try {
    const r = cli(['temporal', 'stop', '--output-dir', out, '--temporal.port', String(await freePort())]);
    expect(r.stderr).toBe('error: no detached Temporal dev server is running\n');
    expect(r.code).toBe(1);
  } finally {
    fs.rmSync(out, { recursive: true, force: true });
  }
});
