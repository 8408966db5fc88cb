/**
 * Optional parts installed on first use (lib/optional-parts.ts): the real scripts/setup.sh `--only`,
 * in a copy of scripts/ in a temporary project, installing a real package from PyPI into a venv
 * (with uv, which it fetches from PyPI first, as a fresh machine does).
 * The W&B part's requirements are swapped for one small package (six), so that a test installs in
 * seconds what the real part installs in about a minute; no network is a closed port as the index,
 * a stuck index a listening socket that never answers.
 */
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { spawnSync } from 'node:child_process';
import { verifiersVenvUses } from '../lib/envs/verifiers/environment';
import { ensurePart, ensureParts, PartNotInstalled, partPython } from '../lib/optional-parts';
import { projectRoot } from '../lib/paths';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-parts-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

/** A project folder holding the real scripts/setup.sh and uv's pin, with one small package as the W&B part. */
function project(name: string): string {
  const root = path.join(tmp, name);
  fs.mkdirSync(path.join(root, 'scripts', 'wandb'), { recursive: true });
  for (const file of ['setup.sh', 'uv.txt'])
    fs.copyFileSync(path.join(projectRoot, 'scripts', file), path.join(root, 'scripts', file));
  fs.writeFileSync(path.join(root, 'scripts', 'wandb', 'requirements.txt'), 'six==1.16.0\n');
  return root;
}

const use = { part: 'wandb', key: '[wandb]' } as const;
const env = (extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv => ({
  PATH: process.env.PATH,
  HOME: process.env.HOME,
  ...extra,
});

test('the first use installs the part with a progress line, atomically; the next use finds it', async () => {
  const root = project('ok');
  const said: string[] = [];
  await ensurePart(use, { root, say: (l) => said.push(l), env: env() });
  expect(said[0]).toMatch(
    /^\[setup\] installing the W&B SDK into \.venv \(first use, by \[wandb\]; about .* MB\) \.\.\.$/,
  );
  expect(said).toContainEqual(expect.stringMatching(/installing the W&B SDK into \.venv: \d+ s$/));
  // Renamed into place whole: its scripts name the final folder, not the one it was built in.
  expect(fs.existsSync(path.join(root, '.venv.partial'))).toBe(false);
  const pip = spawnSync(path.join(root, '.venv', 'bin', 'pip'), ['show', 'six'], { encoding: 'utf8' });
  expect(pip.stdout).toMatch(/^Version: 1\.16\.0$/m);
  expect(fs.readFileSync(path.join(root, '.venv', 'pyvenv.cfg'), 'utf8')).not.toContain('.partial');
  const again: string[] = [];
  await ensurePart(use, { root, say: (l) => again.push(l), env: env() });
  expect(again).toEqual([]);
}, 180_000);

test('no network: the error names the config key and the set-up command, and leaves no venv', async () => {
  const root = project('offline');
  const closed = net.createServer();
  await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
  const port = (closed.address() as net.AddressInfo).port;
  await new Promise((r) => closed.close(r)); // nothing listens there now
  const said: string[] = [];
  const install = ensurePart(use, {
    root,
    say: (l) => said.push(l),
    env: env({ PIP_INDEX_URL: `http://127.0.0.1:${port}/simple` }),
  });
  await expect(install).rejects.toThrow(PartNotInstalled);
  await expect(install).rejects.toThrow(
    /^\[wandb\]: the W&B SDK is not installed \(\.venv\/ is missing\), and installing it now failed \(scripts\/setup\.sh exited with 1: the package index could not be reached\): install it ahead of time, on a machine with network, with `bash scripts\/setup\.sh --wandb`$/,
  );
  expect(fs.existsSync(partPython('wandb', root))).toBe(false);
  expect(fs.existsSync(path.join(root, '.venv'))).toBe(false);
}, 180_000);

test('an install that hangs is killed at its deadline, and leaves no venv', async () => {
  const root = project('stuck');
  const sockets: net.Socket[] = [];
  const silent = net.createServer((s) => sockets.push(s)); // accepts, never answers
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
  const port = (silent.address() as net.AddressInfo).port;
  try {
    const install = ensurePart(use, {
      root,
      say: () => undefined,
      env: env({ PIP_INDEX_URL: `http://127.0.0.1:${port}/simple`, PIP_TIMEOUT: '600' }),
      deadlineMs: 8_000,
    });
    await expect(install).rejects.toThrow(/installing it now failed \(it did not finish within 8 s\)/);
    expect(fs.existsSync(path.join(root, '.venv'))).toBe(false);
  } finally {
    for (const s of sockets) s.destroy();
    await new Promise((r) => silent.close(r));
  }
}, 180_000);

test('PRIME_SETUP=0 (a machine staged ahead of time): no install is tried, the error says what to run', async () => {
  const root = project('staged');
  const said: string[] = [];
  await expect(
    ensureParts([use, { part: 'wandb', key: 'another' }], {
      root,
      say: (l) => said.push(l),
      env: env({ PRIME_SETUP: '0' }),
    }),
  ).rejects.toThrow(
    '[wandb]: the W&B SDK is not installed (.venv/ is missing), and PRIME_SETUP=0 says this machine installs nothing: install it ahead of time, on a machine with network, with `bash scripts/setup.sh --wandb`',
  );
  expect(said).toEqual([]);
  expect(fs.existsSync(path.join(root, '.setup-stamps'))).toBe(false);
});

test('the config keys that use the verifiers venv: verifiers envs without args.python', () => {
  const envs = [
    { id: 'reverse-text' },
    { id: 'verifiers:reverse_words', args: {} },
    { id: 'verifiers:other', args: { python: '/opt/py/bin/python' } },
  ];
  expect(verifiersVenvUses('env', envs)).toEqual([{ part: 'verifiers', key: 'env[1].id' }]);
  expect(verifiersVenvUses('data.env', { id: 'verifiers:reverse_words', args: {} })).toEqual([
    { part: 'verifiers', key: 'data.env.id' },
  ]);
  expect(verifiersVenvUses('data.env', undefined)).toEqual([]);
});
