/**
 * `[wandb]`: a run's step metrics (metrics.jsonl, documented names included) logged to Weights &
 * Biases with the official SDK, the Python `wandb` package that scripts/setup.sh installs into
 * .venv/. It runs as a sidecar process (scripts/wandb/sidecar.py) of the process that follows the
 * run (the `followWandb` activity, activities/wandb.ts): this module tails metrics.jsonl and passes
 * each new line on, so W&B never slows or fails a step, and a re-launched run resumes the same W&B
 * run (its id comes from the run folder) from the first step W&B does not have.
 *
 * W&B is on when the run has a `[wandb]` section (its project defaults to "prime-rl", as in
 * prime-rl) and either WANDB_API_KEY is set or WANDB_MODE=offline (a local run folder under
 * `<run>/wandb/`, for `wandb sync`). The first such run installs the SDK (lib/optional-parts.ts).
 * Otherwise, or when the SDK cannot be installed or cannot start (no network, a bad key), it says
 * so once, why, and the run goes on: every way out of startWandb says one line. A run without
 * `[wandb]` does not call it.
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createInterface } from 'node:readline';
import { ensurePart, partPython, PartNotInstalled } from '../optional-parts';
import { projectRoot } from '../paths';
import { readStepMetrics, type StepRecord } from '../runfolder/metrics';

export interface WandbSettings {
  project: string;
  name?: string;
  entity?: string;
}

export interface WandbOptions {
  settings: WandbSettings;
  runName: string;
  runDir: string;
  metricsFile: string;
  /** Logged as the W&B run's config. */
  config: unknown;
  /** One line for the user (each said once). */
  say(line: string): void;
  env?: NodeJS.ProcessEnv;
  /** How often metrics.jsonl is read. */
  pollMs?: number;
}

/** The Python with the wandb package (installed on first use); PRIME_WANDB_PYTHON overrides it. */
export function wandbPython(env: NodeJS.ProcessEnv = process.env): string {
  return env.PRIME_WANDB_PYTHON ?? partPython('wandb');
}

/** Why W&B logging is off, or undefined when it can start (once its SDK is installed). */
export function wandbOff(env: NodeJS.ProcessEnv = process.env): string | undefined {
  const mode = env.WANDB_MODE;
  if (mode === 'disabled') return 'WANDB_MODE=disabled';
  if (mode !== 'offline' && !env.WANDB_API_KEY)
    return 'WANDB_API_KEY is not set (set it, or WANDB_MODE=offline to write a local W&B run folder)';
  if (env.PRIME_WANDB_PYTHON !== undefined && !fs.existsSync(env.PRIME_WANDB_PYTHON))
    return `PRIME_WANDB_PYTHON ${env.PRIME_WANDB_PYTHON} does not exist`;
  return undefined;
}

/** The numbers of a step record, nested ones as `a/b` (W&B's section/name). */
export function flattenMetrics(record: Record<string, unknown>, prefix = ''): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(record)) {
    const key = prefix ? `${prefix}/${k}` : k;
    if (typeof v === 'number' && Number.isFinite(v)) out[key] = v;
    else if (typeof v === 'object' && v !== null && !Array.isArray(v))
      Object.assign(out, flattenMetrics(v as Record<string, unknown>, key));
  }
  return out;
}

/** A W&B run id for a run folder: the same folder resumes the same W&B run. */
function runId(runName: string, runDir: string): string {
  const hash = createHash('sha256').update(path.resolve(runDir)).digest('hex').slice(0, 8);
  return `${runName.replace(/[^A-Za-z0-9_-]/g, '-').slice(0, 50)}-${hash}`;
}

export interface WandbLogger {
  /** Logs the steps not yet logged, finishes the W&B run and waits for the sidecar to exit. */
  close(): Promise<void>;
}

/**
 * Starts logging `metricsFile` to W&B, or says once why not and returns undefined. Never throws
 * for W&B's sake: a sidecar that fails is reported once and left.
 */
export async function startWandb(opts: WandbOptions): Promise<WandbLogger | undefined> {
  const env = opts.env ?? process.env;
  const off = wandbOff(env);
  if (off) {
    opts.say(`W&B logging is off: ${off}; the run goes on without it`);
    return undefined;
  }
  if (env.PRIME_WANDB_PYTHON === undefined) {
    try {
      await ensurePart({ part: 'wandb', key: '[wandb]' }, { say: opts.say, env });
    } catch (e) {
      if (!(e instanceof PartNotInstalled)) throw e;
      opts.say(`W&B logging is off: ${e.message}; the run goes on without it`);
      return undefined;
    }
  }
  const child: ChildProcessWithoutNullStreams = spawn(
    wandbPython(env),
    [path.join(projectRoot, 'scripts', 'wandb', 'sidecar.py')],
    {
      env: { ...env, WANDB_SILENT: env.WANDB_SILENT ?? 'true' },
      stdio: ['pipe', 'pipe', 'pipe'],
    },
  );
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => void (stderr = (stderr + d.toString()).slice(-2000)));
  child.stdin.on('error', () => undefined); // a sidecar that died: reported through its exit
  const exited = new Promise<number | null>((resolve) => {
    child.on('exit', (code) => resolve(code));
    child.on('error', (e) => {
      stderr += String(e);
      resolve(-1);
    });
  });
  const lines = createInterface({ input: child.stdout });
  const firstReply = new Promise<string | undefined>((resolve) => {
    lines.once('line', resolve);
    void exited.then(() => resolve(undefined));
  });
  fs.mkdirSync(opts.runDir, { recursive: true });
  child.stdin.write(
    `${JSON.stringify({
      init: {
        project: opts.settings.project,
        name: opts.settings.name ?? opts.runName,
        entity: opts.settings.entity,
        id: runId(opts.runName, opts.runDir),
        dir: opts.runDir,
        config: opts.config,
      },
    })}\n`,
  );
  const reply = await firstReply;
  let parsed: { ok: boolean; start_step?: number; where?: string; error?: string } | undefined;
  try {
    parsed = reply === undefined ? undefined : JSON.parse(reply);
  } catch {
    parsed = { ok: false, error: `the sidecar replied '${reply!.slice(0, 200)}', not its JSON line` };
  }
  if (!parsed?.ok) {
    const why = parsed?.error ?? (stderr.trim().split('\n').pop() || 'the sidecar exited');
    opts.say(`W&B logging is off: ${why}; the run goes on without it`);
    child.stdin.end();
    await exited;
    return undefined;
  }
  opts.say(
    `W&B logging to ${parsed.where}${env.WANDB_MODE === 'offline' ? ' (offline: `wandb sync` uploads it)' : ''}`,
  );
  let next = parsed.start_step ?? 0;
  let broken = false;
  let closing = false;
  const pump = () => {
    if (broken) return;
    let records: StepRecord[];
    try {
      records = readStepMetrics(opts.metricsFile);
    } catch {
      return; // a line being written: the next poll reads it whole
    }
    for (const r of records) {
      if (r.step < next) continue;
      child.stdin.write(`${JSON.stringify({ step: r.step, metrics: flattenMetrics(r) })}\n`);
      next = r.step + 1;
    }
  };
  void exited.then((code) => {
    if (!closing) {
      broken = true;
      opts.say(
        `W&B logging stopped: the sidecar exited (${code}): ${stderr.trim().split('\n').pop() ?? ''}; the run goes on without it`,
      );
    }
  });
  const timer = setInterval(pump, opts.pollMs ?? 2000);
  return {
    async close() {
      clearInterval(timer);
      pump();
      closing = true;
      child.stdin.end();
      await exited;
    },
  };
}
