/**
 * `prime-rl rl` on one machine: a Temporal server (the configured one, or a local dev server),
 * the inference server and the cpu and trainer workers as child processes (logs in
 * `<run>/logs/`), restarted whenever they die; then the `rl` workflow, started under the run name
 * or re-attached to if it is already running, with a live progress line until it completes.
 * Ctrl-C stops the local processes and leaves the workflow where it is: the same command resumes it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Client, Connection, WorkflowExecutionAlreadyStartedError, WorkflowNotFoundError } from '@temporalio/client';
import { writeFileAtomic } from '../lib/atomic';
import type { RLConfig, WorkerConfig } from '../lib/config/schemas';
import { projectRoot } from '../lib/paths';
import { RunLayout } from '../lib/run/layout';
import { devServerOptions, isListening, spawnDevServer, startDevServer } from '../lib/temporal/devserver';
import { progressQuery, type RLProgress, type RLResult } from '../workflows/rl';
import { taskQueues } from './worker';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A child process kept alive: restarted (after a short pause) whenever it exits, until stopped. */
class Supervised {
  private child?: ChildProcess;
  private stopped = false;
  restarts = 0;

  constructor(
    readonly name: string,
    private readonly start: () => ChildProcess,
    private readonly log: (line: string) => void,
  ) {
    this.launch();
  }

  private launch(): void {
    const child = this.start();
    this.child = child;
    child.once('exit', (code, signal) => {
      if (this.stopped) return;
      this.restarts++;
      this.log(`${this.name} exited (code ${code}, signal ${signal}); restarting`);
      setTimeout(() => !this.stopped && this.launch(), 1000);
    });
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    await exited;
    clearTimeout(timer);
  }
}

/** A `prime-rl <args>` child process with output appended to `logFile`. */
function cliProcess(args: string[], logFile: string): () => ChildProcess {
  return () => {
    const fd = fs.openSync(logFile, 'a');
    const child = spawn(process.execPath, [path.join(projectRoot, 'bin', 'prime-rl.js'), ...args], { stdio: ['ignore', fd, fd] });
    fs.closeSync(fd);
    return child;
  };
}

function writeJson(file: string, value: unknown): string {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  writeFileAtomic(file, `${JSON.stringify(value, null, 2)}\n`);
  return file;
}

function formatDuration(s: number): string {
  if (!Number.isFinite(s)) return '?';
  const m = Math.floor(s / 60);
  return m > 0 ? `${m}m${String(Math.round(s % 60)).padStart(2, '0')}s` : `${Math.round(s)}s`;
}

export interface LocalRun {
  config: RLConfig;
  layout: RunLayout;
  /** The local processes, for tests that kill them. */
  processes: Record<'temporal' | 'inference' | 'cpu' | 'trainer', { pid?: number; restarts: number }>;
  result: Promise<RLResult>;
  stop(): Promise<void>;
}

/** Starts everything a run needs locally and the workflow; `result` settles when the run completes. */
export async function launchRun(config: RLConfig, opts: { quiet?: boolean } = {}): Promise<LocalRun> {
  const layout = RunLayout.of(config.output_dir, config.run_name);
  fs.mkdirSync(layout.logsDir, { recursive: true });
  const say = (line: string) => {
    if (!opts.quiet) process.stderr.write(`${line}\n`);
    fs.appendFileSync(path.join(layout.logsDir, 'launcher.log'), `${new Date().toISOString()} ${line}\n`);
  };

  // Temporal: the configured server, a running local one, or one we start and keep alive.
  let temporal: Supervised | undefined;
  const address = config.temporal.address ?? `${config.temporal.ip}:${config.temporal.port}`;
  if (!config.temporal.address && !(await isListening(config.temporal.ip, config.temporal.port))) {
    const serverOpts = devServerOptions(config.temporal, config.output_dir);
    let first: ChildProcess | undefined = (await startDevServer(serverOpts)).child;
    // Restarts reuse the same SQLite file: workflows and their history survive.
    temporal = new Supervised('temporal', () => first ?? spawnDevServer(serverOpts), say);
    first = undefined;
    say(`Temporal dev server on ${address} (UI http://${serverOpts.ip}:${serverOpts.uiPort})`);
  }

  const configs = path.join(layout.dir, 'configs');
  const workerBase: Omit<WorkerConfig, 'pool'> = {
    output_dir: config.output_dir,
    env_workers: config.orchestrator.env_workers,
    env_timeout_s: config.orchestrator.env_timeout_s,
    threads: config.trainer.threads,
    temporal: { ...config.temporal, address },
  };
  const children = {
    inference: new Supervised('inference', cliProcess(['inference', '@', writeJson(path.join(configs, 'inference.json'), config.inference)], path.join(layout.logsDir, 'inference.log')), say),
    cpu: new Supervised('cpu worker', cliProcess(['worker', '@', writeJson(path.join(configs, 'worker-cpu.json'), { ...workerBase, pool: 'cpu' })], path.join(layout.logsDir, 'orchestrator.log')), say),
    trainer: new Supervised('trainer worker', cliProcess(['worker', '@', writeJson(path.join(configs, 'worker-trainer.json'), { ...workerBase, pool: 'trainer' })], path.join(layout.logsDir, 'trainer.log')), say),
  };

  const stop = async () => {
    await Promise.all(Object.values(children).map((c) => c.stop()));
    await temporal?.stop();
  };

  try {
    const connection = await Connection.connect({ address });
    const client = new Client({ connection, namespace: config.temporal.namespace });
    const workflowId = config.run_name;
    let handle = client.workflow.getHandle<(c: RLConfig) => Promise<RLResult>>(workflowId);
    let running = false;
    try {
      const d = await handle.describe();
      running = d.status.name === 'RUNNING';
    } catch (e) {
      if (!(e instanceof WorkflowNotFoundError)) throw e;
    }
    if (running) say(`re-attached to running workflow ${workflowId}`);
    else {
      try {
        handle = await client.workflow.start<(c: RLConfig) => Promise<RLResult>>('rl', {
          taskQueue: taskQueues(config.temporal.task_queue).cpu,
          workflowId,
          args: [config],
          memo: { runDir: layout.dir, model: config.model.name ?? '', maxSteps: config.max_steps ?? null },
        });
        say(`started workflow ${workflowId}`);
      } catch (e) {
        if (!(e instanceof WorkflowExecutionAlreadyStartedError)) throw e;
        say(`re-attached to running workflow ${workflowId}`);
      }
    }
    const result = (async () => {
      const started = Date.now();
      let firstStep: number | undefined;
      const ticker = setInterval(async () => {
        try {
          const p = await handle.query<RLProgress>(progressQuery);
          firstStep ??= p.trained;
          const done = p.trained - firstStep;
          const rate = done > 0 ? (Date.now() - started) / 1000 / done : NaN;
          const left = p.maxSteps !== undefined ? (p.maxSteps - p.trained) * rate : NaN;
          const m = p.lastTrain?.metrics;
          const line = [
            `step ${p.trained}/${p.maxSteps ?? '∞'}`,
            `reward ${p.lastReward?.toFixed(3) ?? '-'}`,
            `loss ${m ? m.loss.toExponential(2) : '-'}`,
            `${m ? Math.round(m.tokens_per_s) : '-'} tok/s`,
            `ETA ${formatDuration(left)}`,
            p.paused ? 'PAUSED' : '',
          ].join(' | ');
          if (!opts.quiet) process.stderr.write(process.stderr.isTTY ? `\r${line.padEnd(100)}` : `${line}\n`);
        } catch {
          // The server may be restarting; the next tick tries again.
        }
      }, 2000);
      try {
        // Long-polls the result; the client rides out a Temporal restart by retrying.
        for (;;) {
          try {
            return await handle.result();
          } catch (e) {
            if ((e as Error).name === 'WorkflowFailedError') throw e;
            await sleep(1000);
          }
        }
      } finally {
        clearInterval(ticker);
        if (!opts.quiet && process.stderr.isTTY) process.stderr.write('\n');
        await connection.close();
      }
    })();
    const proc = (s?: Supervised) => ({
      get pid() {
        return s?.pid;
      },
      get restarts() {
        return s?.restarts ?? 0;
      },
    });
    return {
      config,
      layout,
      processes: { temporal: proc(temporal), inference: proc(children.inference), cpu: proc(children.cpu), trainer: proc(children.trainer) },
      result,
      stop,
    };
  } catch (e) {
    await stop();
    throw e;
  }
}

/** The `rl` command: launch, follow, summarise, clean up. */
export async function runRl(config: RLConfig): Promise<void> {
  const run = await launchRun(config);
  const interrupted = new Promise<never>((_, reject) => {
    const onSignal = (sig: string) => reject(Object.assign(new Error(`${sig}: stopped the local processes; run the same command to resume ${config.run_name}`), { signal: sig }));
    process.once('SIGINT', () => onSignal('SIGINT'));
    process.once('SIGTERM', () => onSignal('SIGTERM'));
  });
  try {
    const result = await Promise.race([run.result, interrupted]);
    process.stdout.write(
      `run ${config.run_name} ${result.stoppedEarly ? 'stopped' : 'completed'}: ${result.steps} steps, last reward ${result.lastReward?.toFixed(3) ?? '-'}\n` +
        `  run folder: ${result.runDir}\n  metrics:    ${run.layout.metricsFile}\n`,
    );
  } finally {
    await run.stop();
  }
}
