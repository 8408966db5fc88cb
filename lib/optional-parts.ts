/**
 * The optional parts of an installation: Python venvs that only some configs use. The main job's
 * set-up (scripts/setup.sh without flags) leaves them out; the first run whose config uses one
 * installs it here, with scripts/setup.sh `--only <flag>` (one source of truth for how), and says
 * so. setup.sh builds a venv beside its folder and renames it into place when complete, so an
 * existing folder is an installed part, and an install that is killed leaves none.
 *
 * Nothing downloads where nothing can: on a machine without network the install fails (within its
 * deadline), and the error names the config key that wanted the part and the set-up command that
 * installs it ahead of time. PRIME_SETUP=0 (a machine staged ahead of time) skips the attempt.
 */
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createInterface } from 'node:readline';
import { formatMs } from './deadline';
import { projectRoot } from './paths';

export interface OptionalPart {
  /** What it is, in messages. */
  what: string;
  /** Its venv, relative to the project root. */
  venv: string;
  /** The scripts/setup.sh flag that installs it. */
  flag: string;
  /** What installing it downloads and writes, about (measured on a fresh machine: docs/benchmarks/setup.md). */
  size: string;
  /** How long installing it may take before it is given up. */
  deadlineMs: number;
}

export const OPTIONAL_PARTS = {
  verifiers: {
    what: 'the verifiers environment',
    venv: '.venv-verifiers',
    flag: '--verifiers',
    size: 'about 560 MB',
    deadlineMs: 20 * 60_000,
  },
  wandb: { what: 'the W&B SDK', venv: '.venv', flag: '--wandb', size: 'about 125 MB', deadlineMs: 10 * 60_000 },
} as const satisfies Record<string, OptionalPart>;
export type OptionalPartName = keyof typeof OPTIONAL_PARTS;

/** A config key that uses an optional part (`env[0].id`, `wandb`). */
export interface PartUse {
  part: OptionalPartName;
  key: string;
}

export interface EnsureOptions {
  /** Where the progress lines go (one line each). */
  say(line: string): void;
  env?: NodeJS.ProcessEnv;
  /** The project whose scripts/setup.sh installs the part and which holds its venv. */
  root?: string;
  /** Overrides the part's deadline. */
  deadlineMs?: number;
}

/** The part is missing and could not be installed now; the message says what to run ahead of time. */
export class PartNotInstalled extends Error {
  override readonly name = 'PartNotInstalled';
  readonly exitCode = 1;
}

/** The part's Python (it exists when the part is installed). */
export function partPython(part: OptionalPartName, root = projectRoot): string {
  return path.join(root, OPTIONAL_PARTS[part].venv, 'bin', 'python');
}

/** The command that installs `part` ahead of time, with the main job's parts. */
export function setupCommand(part: OptionalPartName): string {
  return `bash scripts/setup.sh ${OPTIONAL_PARTS[part].flag}`;
}

/** Installs in this process, once per part and root (two keys using one part share the install). */
const installs = new Map<string, Promise<void>>();

/**
 * Makes sure each used part is installed, installing the missing ones now (the first key that uses
 * a part is the one its messages name). Throws `PartNotInstalled` when one cannot be.
 */
export async function ensureParts(uses: readonly PartUse[], opts: EnsureOptions): Promise<void> {
  const seen = new Set<OptionalPartName>();
  for (const use of uses) {
    if (seen.has(use.part)) continue;
    seen.add(use.part);
    await ensurePart(use, opts);
  }
}

/** Makes sure `use.part` is installed (see ensureParts). */
export async function ensurePart(use: PartUse, opts: EnsureOptions): Promise<void> {
  const root = opts.root ?? projectRoot;
  if (fs.existsSync(partPython(use.part, root))) return;
  const id = `${root}\0${use.part}`;
  let install = installs.get(id);
  if (!install) {
    install = install_(use, root, opts).finally(() => installs.delete(id));
    installs.set(id, install);
  }
  await install;
}

async function install_(use: PartUse, root: string, opts: EnsureOptions): Promise<void> {
  const part = OPTIONAL_PARTS[use.part];
  const env = opts.env ?? process.env;
  const missing = `${use.key}: ${part.what} is not installed (${part.venv}/ is missing)`;
  const ahead = `install it ahead of time, on a machine with network, with \`${setupCommand(use.part)}\``;
  if (env.PRIME_SETUP === '0')
    throw new PartNotInstalled(`${missing}, and PRIME_SETUP=0 says this machine installs nothing: ${ahead}`);
  opts.say(`[setup] installing ${part.what} into ${part.venv} (first use, by ${use.key}; ${part.size}) ...`);
  const failed = await runSetup(root, ['--only', part.flag], env, opts.deadlineMs ?? part.deadlineMs, opts.say);
  if (failed !== undefined)
    throw new PartNotInstalled(`${missing}, and installing it now failed (${failed}): ${ahead}`);
  if (!fs.existsSync(partPython(use.part, root)))
    throw new PartNotInstalled(`${missing}, and scripts/setup.sh ${part.flag} did not build it: ${ahead}`);
}

/** pip's and uv's words for a package index they cannot connect to. */
const NO_NETWORK =
  /Failed to establish a new connection|Temporary failure in name resolution|Network is unreachable|tcp connect error|dns error/;

/**
 * Runs scripts/setup.sh with `args` in its own process group, its output line by line to `say`;
 * past `deadlineMs` the group is killed. Resolves to why it failed, or undefined.
 */
function runSetup(
  root: string,
  args: string[],
  env: NodeJS.ProcessEnv,
  deadlineMs: number,
  say: (line: string) => void,
): Promise<string | undefined> {
  return new Promise((resolve) => {
    const child = spawn('bash', [path.join(root, 'scripts', 'setup.sh'), ...args], {
      cwd: root,
      env,
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let last = '';
    // pip without network ends on a misleading "ResolutionImpossible"; its retries say why.
    let unreachable = false;
    for (const stream of [child.stdout, child.stderr]) {
      createInterface({ input: stream }).on('line', (line) => {
        if (line.trim() !== '') last = line.trim();
        if (NO_NETWORK.test(line)) unreachable = true;
        say(line);
      });
    }
    let expired = false;
    const killGroup = (signal: NodeJS.Signals) => {
      try {
        process.kill(-child.pid!, signal);
      } catch {
        // already gone
      }
    };
    const timer = setTimeout(() => {
      expired = true;
      killGroup('SIGTERM');
      setTimeout(() => killGroup('SIGKILL'), 5_000).unref();
    }, deadlineMs);
    child.on('error', (e) => {
      clearTimeout(timer);
      resolve(`scripts/setup.sh could not start: ${e.message}`);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      if (expired) resolve(`it did not finish within ${formatMs(deadlineMs)}`);
      else if (code === 0) resolve(undefined);
      else if (unreachable)
        resolve(`scripts/setup.sh exited with ${code ?? signal}: the package index could not be reached`);
      else resolve(`scripts/setup.sh exited with ${code ?? signal}${last ? `: ${last}` : ''}`);
    });
  });
}
