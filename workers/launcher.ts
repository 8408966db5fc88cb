/**
 * `prime-rl rl|sft|eval` on one machine: a Temporal server (the configured one, or a local dev
 * server), the processes the workflow needs as child processes (rl: inference server, cpu and
 * trainer workers; sft: cpu and trainer; eval: cpu, plus the inference server unless it evaluates
 * an external API), logs in `<run>/logs/`, restarted whenever they die; then the workflow, started
 * under the run name or re-attached to if it is already running, with a live progress line until
 * it completes. Ctrl-C stops the local processes and leaves the workflow where it is: the same
 * command resumes it. A launcher killed outright (SIGKILL, OOM) takes its processes with it: each
 * watches a pipe from it and stops when it closes. `<run>/launcher.json` records the launcher and
 * its processes (pid + start time), so the same command, run again, stops any that linger and
 * takes over the Temporal dev server the killed launcher started (which stays up: other commands
 * may use it).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Client, Connection, WorkflowExecutionAlreadyStartedError, WorkflowNotFoundError } from '@temporalio/client';
import { writeFileAtomic } from '../lib/atomic';
import { inferenceSchema, type EvalConfig, type InferenceConfig, type RLConfig, type SFTConfig, type TemporalConfig, type WorkerConfig } from '../lib/config/schemas';
import { readEvalResults, renderEvalTable } from '../lib/eval';
import { writeReport } from '../lib/report';
import { projectRoot } from '../lib/paths';
import { RunLayout } from '../lib/run/layout';
import { stepLine } from '../lib/run/progress';
import { startWandb } from '../lib/run/wandb';
import { asProcessId, isRunning, parentPipeOptions, processId, terminateProcess, type ProcessId } from '../lib/proc';
import { devServerOptions, forgetDevServer, isListening, recordDevServer, runningDevServer, spawnDevServer, startDevServer } from '../lib/temporal/devserver';
import { CommandError } from '../lib/cli/command';
import type { EvalResult } from '../workflows/eval';
import type { RLProgress, RLResult } from '../workflows/rl';
import type { SftProgress, SftResult } from '../workflows/sft';
import { ConfigError } from '../lib/config/errors';
import { taskQueues } from './worker';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A process kept alive: restarted (after a short pause) whenever it exits, until stopped. It is our
 * child, or one that a killed launcher left running (adopted: no exit event reaches us, so it is
 * polled). `onStart` sees each process it starts, to record it.
 */
class Supervised {
  private child?: ChildProcess;
  private adopted?: { id: ProcessId; poll: NodeJS.Timeout };
  private stopped = false;
  restarts = 0;

  constructor(
    readonly name: string,
    private readonly start: () => ChildProcess,
    private readonly log: (line: string) => void,
    private readonly onStart: (id: ProcessId) => void = () => undefined,
    adopt?: ProcessId,
  ) {
    if (adopt) this.adopt(adopt);
    else this.launch();
  }

  private exited(how: string): void {
    if (this.stopped) return;
    this.restarts++;
    this.log(`${this.name} exited (${how}); restarting`);
    setTimeout(() => !this.stopped && this.launch(), 1000);
  }

  private launch(): void {
    const child = this.start();
    this.child = child;
    const id = processId(child.pid);
    if (id) this.onStart(id);
    child.once('exit', (code, signal) => this.exited(`code ${code}, signal ${signal}`));
  }

  private adopt(id: ProcessId): void {
    const poll = setInterval(() => {
      if (isRunning(id)) return;
      clearInterval(poll);
      this.adopted = undefined;
      this.exited(`pid ${id.pid} gone`);
    }, 500);
    this.adopted = { id, poll };
  }

  get pid(): number | undefined {
    return this.adopted?.id.pid ?? this.child?.pid;
  }

  /** Stops supervising and leaves the process running, no longer holding this process open. */
  release(): void {
    this.stopped = true;
    clearInterval(this.adopted?.poll);
    this.child?.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.adopted) {
      clearInterval(this.adopted.poll);
      return terminateProcess(this.adopted.id, 15_000);
    }
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    await exited;
    clearTimeout(timer);
  }
}

/** Ids of the workflows running on a Temporal server, except `own` and its child workflows. */
async function otherOpenWorkflows(address: string, namespace: string, own: string): Promise<string[]> {
  const connection = await Connection.connect({ address, connectTimeout: 5000 });
  try {
    const ids: string[] = [];
    for await (const w of new Client({ connection, namespace }).workflow.list({ query: 'ExecutionStatus = "Running"' })) {
      if (![w.workflowId, w.parentExecution?.workflowId, w.rootExecution?.workflowId].includes(own)) ids.push(w.workflowId);
    }
    return ids;
  } finally {
    await connection.close();
  }
}

/**
 * A `prime-rl <args>` child process with output appended to `logFile`. It dies with this process:
 * it watches a pipe from us (see `watchParentPipe`), which the kernel closes however we die.
 */
function cliProcess(args: string[], logFile: string): () => ChildProcess {
  return () => {
    const fd = fs.openSync(logFile, 'a');
    const child = spawn(process.execPath, [path.join(projectRoot, 'bin', 'prime-rl.js'), ...args], parentPipeOptions(['ignore', fd, fd]));
    fs.closeSync(fd);
    return child;
  };
}

function writeJson(file: string, value: unknown): string {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  writeFileAtomic(file, `${JSON.stringify(value, null, 2)}\n`);
  return file;
}

type Pool = 'temporal' | 'inference' | 'cpu' | 'trainer';

/** What to launch: the workflow, and the local processes it needs. */
export interface LaunchSpec {
  runName: string;
  outputDir: string;
  temporal: TemporalConfig;
  /** The inference server to run, if the workflow samples from one. */
  inference?: InferenceConfig;
  /** Worker pools to run. */
  pools: ('cpu' | 'trainer')[];
  worker: Pick<WorkerConfig, 'env_workers' | 'env_timeout_s' | 'threads'>;
  workflowType: 'rl' | 'sft' | 'eval';
  args: unknown[];
  memo: Record<string, unknown>;
  /** The progress line, from the workflow's `progress` query; none = no progress line. */
  progressLine?: (progress: never, rate: { started: number; first?: number }) => string;
}

export interface LocalRun<R> {
  layout: RunLayout;
  /** The local processes, for tests that kill them (no pid: not run for this workflow). */
  processes: Record<Pool, { pid?: number; restarts: number }>;
  result: Promise<R>;
  stop(): Promise<void>;
}

/**
 * `<run>/launcher.json`, while a launcher runs the run: that launcher and the processes it started,
 * so that the next launch of the run can tell a launcher still running from one that was killed, and
 * find what the killed one left.
 */
interface LauncherRecord {
  launcher: ProcessId;
  processes: Partial<Record<Exclude<Pool, 'temporal'>, ProcessId>>;
}

function readLauncherRecord(layout: RunLayout): LauncherRecord | undefined {
  try {
    const raw = JSON.parse(fs.readFileSync(layout.launcherFile, 'utf8')) as { launcher?: unknown; processes?: Record<string, unknown> };
    const launcher = asProcessId(raw.launcher);
    if (launcher === undefined) return undefined;
    const processes: LauncherRecord['processes'] = {};
    for (const name of ['inference', 'cpu', 'trainer'] as const) {
      const id = asProcessId(raw.processes?.[name]);
      if (id) processes[name] = id;
    }
    return { launcher, processes };
  } catch {
    return undefined;
  }
}

/** Starts everything a workflow needs locally and the workflow; `result` settles when it completes. */
export async function launch<R>(spec: LaunchSpec, opts: { quiet?: boolean } = {}): Promise<LocalRun<R>> {
  const layout = RunLayout.of(spec.outputDir, spec.runName);
  fs.mkdirSync(layout.logsDir, { recursive: true });
  const say = (line: string) => {
    if (!opts.quiet) process.stderr.write(`${line}\n`);
    fs.appendFileSync(path.join(layout.logsDir, 'launcher.log'), `${new Date().toISOString()} ${line}\n`);
  };

  // Another launcher of this run still running (another terminal, or this process) owns its processes.
  const previous = readLauncherRecord(layout);
  if (previous && isRunning(previous.launcher)) {
    throw new CommandError(`run ${spec.runName} is already launched by process ${previous.launcher.pid} (${layout.launcherFile}); stop that one (Ctrl-C, or kill ${previous.launcher.pid}) before launching it again`);
  }
  // Processes of a killed launcher exit on their own (see cliProcess); one that has not yet (still
  // draining, or stuck) is stopped here: it would hold its port, or poll our task queues.
  await Promise.all(
    Object.entries(previous?.processes ?? {})
      .filter(([, id]) => isRunning(id))
      .map(([name, id]) => {
        say(`stopping ${name} (pid ${id.pid}), left running by the killed launcher ${previous!.launcher.pid} of this run`);
        return terminateProcess(id, 10_000);
      }),
  );

  // The run's own inference server must get its port: were another process (another run's server)
  // answering there, rollouts would silently come from that server's model.
  const http = spec.inference?.server;
  if (http && http.port !== 0 && (await isListening(http.host === '0.0.0.0' ? '127.0.0.1' : http.host, http.port))) {
    throw new ConfigError(`inference.server.port: ${http.host}:${http.port} is already in use (another run's inference server?); choose a free port with --inference.server.port (in rl, orchestrator.base_urls follows it unless set)`);
  }

  const self = processId(process.pid)!;
  const record: LauncherRecord = { launcher: self, processes: {} };
  const saveRecord = () => writeJson(layout.launcherFile, record);
  saveRecord();

  let temporal: Supervised | undefined;
  const address = spec.temporal.address ?? `${spec.temporal.ip}:${spec.temporal.port}`;
  const serverOpts = { ...devServerOptions(spec.temporal, spec.outputDir), detached: true };
  const recordServer = (pid: number | undefined) => pid !== undefined && recordDevServer(spec.outputDir, { pid, port: serverOpts.port, owner: self });

  const children: Partial<Record<Pool, Supervised>> = {};
  /** The run's local processes: inference server (if any) and worker pools, each supervised. */
  const spawnChildren = () => {
    const configs = path.join(layout.dir, 'configs');
    const workerBase: Omit<WorkerConfig, 'pool'> = { output_dir: spec.outputDir, ...spec.worker, temporal: { ...spec.temporal, address } };
    const recorded = (pool: keyof LauncherRecord['processes']) => (id: ProcessId) => {
      record.processes[pool] = id;
      saveRecord();
    };
    if (spec.inference) {
      children.inference = new Supervised('inference', cliProcess(['inference', '@', writeJson(path.join(configs, 'inference.json'), spec.inference)], path.join(layout.logsDir, 'inference.log')), say, recorded('inference'));
    }
    const logName = { cpu: 'orchestrator.log', trainer: 'trainer.log' } as const;
    for (const pool of spec.pools) {
      const file = writeJson(path.join(configs, `worker-${pool}.json`), { ...workerBase, pool });
      children[pool] = new Supervised(`${pool} worker`, cliProcess(['worker', '@', file], path.join(layout.logsDir, logName[pool])), say, recorded(pool));
    }
  };

  const stop = async () => {
    await Promise.all(Object.values(children).map((c) => c.stop()));
    if (temporal) {
      // Another command may have found our server listening and be running a workflow on it.
      const others = await otherOpenWorkflows(address, spec.temporal.namespace, spec.runName).catch(() => []);
      const pid = temporal.pid;
      if (others.length === 0 || pid === undefined) {
        await temporal.stop();
        if (pid !== undefined) forgetDevServer(spec.outputDir, pid);
      } else {
        temporal.release();
        recordDevServer(spec.outputDir, { pid, port: serverOpts.port });
        say(`Temporal dev server left running (pid ${pid}) for open workflows ${others.join(', ')}; 'prime-rl temporal stop --output-dir ${spec.outputDir}' stops it`);
      }
    }
    fs.rmSync(layout.launcherFile, { force: true });
  };

  let opened: Connection | undefined;
  try {
    // Temporal: the configured server, a running local one, or one we start and keep alive (in its
    // own process group: whether it outlives this run is for `stop` to decide, not a Ctrl-C; if this
    // launcher is killed, it stays up, and the next launch takes it over). Restarts reuse the same
    // SQLite file: workflows and their history survive.
    if (!spec.temporal.address) {
      const left = runningDevServer(spec.outputDir);
      if (left && left.port === serverOpts.port && left.owner && !isRunning(left.owner)) {
        recordServer(left.pid);
        temporal = new Supervised('temporal', () => spawnDevServer(serverOpts), say, (id) => recordServer(id.pid), left);
        say(`took over the Temporal dev server on ${address} (pid ${left.pid}) of the killed launcher ${left.owner.pid}`);
        const deadline = Date.now() + 60_000;
        while (!(await isListening(serverOpts.ip, serverOpts.port))) {
          if (Date.now() > deadline) throw new Error(`Temporal dev server did not open ${address} within 60 s; see ${serverOpts.logFile}`);
          await sleep(200);
        }
      } else if (!(await isListening(spec.temporal.ip, spec.temporal.port))) {
        let first: ChildProcess | undefined = (await startDevServer(serverOpts, (child) => recordServer(child.pid))).child;
        temporal = new Supervised('temporal', () => first ?? spawnDevServer(serverOpts), say, (id) => recordServer(id.pid));
        first = undefined;
        say(`Temporal dev server on ${address} (UI http://${serverOpts.ip}:${serverOpts.uiPort})`);
      }
    }

    const connection = (opened = await Connection.connect({ address }));
    const client = new Client({ connection, namespace: spec.temporal.namespace });
    const workflowId = spec.runName;
    let handle = client.workflow.getHandle<(...args: unknown[]) => Promise<R>>(workflowId);
    // Re-attach only to this very run: same workflow type and same run folder. Two output dirs
    // may hold runs of the same name, and one Temporal server sees both under one workflow id.
    const checkAttachable = async (): Promise<boolean> => {
      const d = await handle.describe();
      if (d.status.name !== 'RUNNING') return false;
      if (d.type !== spec.workflowType) throw new Error(`workflow ${workflowId} is a running ${d.type} run, not ${spec.workflowType}: use another run_name`);
      const runDir = (d.memo as { runDir?: unknown } | undefined)?.runDir;
      if (runDir !== path.resolve(layout.dir)) throw new Error(`workflow ${workflowId} is running for run folder ${String(runDir)}, not ${path.resolve(layout.dir)}: use another run_name`);
      return true;
    };
    let running = false;
    try {
      running = await checkAttachable();
    } catch (e) {
      if (!(e instanceof WorkflowNotFoundError)) throw e;
    }
    // Checked before any process starts, so a refused launch leaves nothing behind.
    spawnChildren();
    if (running) say(`re-attached to running workflow ${workflowId}`);
    else {
      try {
        handle = await client.workflow.start<(...args: unknown[]) => Promise<R>>(spec.workflowType, {
          taskQueue: taskQueues(spec.temporal.task_queue).cpu,
          workflowId,
          args: spec.args,
          memo: spec.memo,
        });
        say(`started ${spec.workflowType} workflow ${workflowId}`);
      } catch (e) {
        if (!(e instanceof WorkflowExecutionAlreadyStartedError)) throw e;
        await checkAttachable();
        say(`re-attached to running workflow ${workflowId}`);
      }
    }
    const result = (async () => {
      const rate: { started: number; first?: number } = { started: Date.now() };
      const line = spec.progressLine;
      // One progress query at a time: while Temporal restarts, a query retries inside the client,
      // and it must have settled before the connection closes (or its retry hits a closed channel).
      let inflight: Promise<void> | undefined;
      const showProgress = async (render: NonNullable<typeof line>) => {
        try {
          const text = render((await handle.query('progress')) as never, rate);
          if (!opts.quiet) process.stderr.write(process.stderr.isTTY ? `\r${text.padEnd(100)}` : `${text}\n`);
        } catch {
          // The server may be restarting; the next tick tries again.
        }
      };
      const ticker = line
        ? setInterval(() => {
            inflight ??= showProgress(line).finally(() => (inflight = undefined));
          }, 2000)
        : undefined;
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
        await inflight;
        if (!opts.quiet && line && process.stderr.isTTY) process.stderr.write('\n');
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
    const processes = { temporal: proc(temporal), inference: proc(children.inference), cpu: proc(children.cpu), trainer: proc(children.trainer) };
    return { layout, processes, result, stop };
  } catch (e) {
    await opened?.close();
    await stop();
    throw e;
  }
}

function trainParts(m: { loss: number; tokens_per_s: number } | undefined): string[] {
  return [`loss ${m ? m.loss.toExponential(2) : '-'}`, `${m ? Math.round(m.tokens_per_s) : '-'} tok/s`];
}

/** An RL run: inference server, cpu and trainer workers, the `rl` workflow. */
export function launchRun(config: RLConfig, opts: { quiet?: boolean } = {}): Promise<LocalRun<RLResult>> {
  return launch<RLResult>(
    {
      runName: config.run_name,
      outputDir: config.output_dir,
      temporal: config.temporal,
      inference: config.inference,
      pools: ['cpu', 'trainer'],
      worker: { env_workers: config.orchestrator.env_workers, env_timeout_s: config.orchestrator.env_timeout_s, threads: config.trainer.threads },
      workflowType: 'rl',
      args: [config],
      memo: { runDir: path.resolve(RunLayout.of(config.output_dir, config.run_name).dir), model: config.model.name ?? '', maxSteps: config.max_steps ?? null },
      progressLine: (p: RLProgress, rate) =>
        stepLine(p.trained, p.maxSteps, rate, [`reward ${p.lastReward?.toFixed(3) ?? '-'}`, ...trainParts(p.lastTrain?.metrics)], { paused: p.paused }),
    },
    opts,
  );
}

/** An SFT run: cpu and trainer workers (no inference), the `sft` workflow. */
export function launchSft(config: SFTConfig, opts: { quiet?: boolean } = {}): Promise<LocalRun<SftResult>> {
  return launch<SftResult>(
    {
      runName: config.run_name,
      outputDir: config.output_dir,
      temporal: config.temporal,
      pools: ['cpu', 'trainer'],
      worker: { env_workers: 1, env_timeout_s: 60, threads: config.threads },
      workflowType: 'sft',
      args: [config],
      memo: { runDir: path.resolve(RunLayout.of(config.output_dir, config.run_name).dir), model: config.model.name, maxSteps: config.max_steps ?? null },
      progressLine: (p: SftProgress, rate) =>
        stepLine(p.trained, p.maxSteps, rate, [...trainParts(p.lastTrain?.metrics), `val ${p.lastValLoss?.toFixed(4) ?? '-'}`], {
          paused: p.paused,
          // The run ends at the first validation at or below the target, maybe long before max_steps.
          mayEndEarly: config.val.target_loss !== undefined ? `sooner if val loss reaches ${config.val.target_loss}` : undefined,
        }),
    },
    opts,
  );
}

/** An eval: a cpu worker, plus an inference server on model.name unless an external API is evaluated. */
export function launchEval(config: EvalConfig, opts: { quiet?: boolean } = {}): Promise<LocalRun<EvalResult>> {
  const local = config.client.base_url === undefined;
  if (local && !config.model.name) throw new ConfigError('model.name: the model folder to evaluate (or client.base_url for an external API)');
  const inference = local
    ? inferenceSchema.parse({
        model: { name: config.model.name, dtype: config.model.dtype, device: config.model.device },
        seq_len: config.seq_len,
        output_dir: config.output_dir,
        seed: config.seed,
        threads: config.threads,
        server: config.server,
        allowed_weight_roots: [config.output_dir, ...(config.weights_dir !== undefined ? [config.weights_dir] : [])],
      })
    : undefined;
  return launch<EvalResult>(
    {
      runName: config.run_name,
      outputDir: config.output_dir,
      temporal: config.temporal,
      inference,
      pools: ['cpu'],
      worker: { env_workers: 2, env_timeout_s: 60, threads: config.threads },
      workflowType: 'eval',
      args: [{ config }],
      memo: { runDir: path.resolve(RunLayout.of(config.output_dir, config.run_name).dir), model: config.model.name ?? '' },
    },
    opts,
  );
}

/** Follows a launched run to its end; Ctrl-C stops the local processes (the workflow stays, resumable). */
async function follow<R>(run: LocalRun<R>, runName: string, done: (result: R) => void): Promise<void> {
  const interrupted = new Promise<never>((_, reject) => {
    const onSignal = (sig: string) => reject(Object.assign(new Error(`${sig}: stopped the local processes; run the same command to resume ${runName}`), { signal: sig }));
    process.once('SIGINT', () => onSignal('SIGINT'));
    process.once('SIGTERM', () => onSignal('SIGTERM'));
  });
  try {
    done(await Promise.race([run.result, interrupted]));
  } finally {
    await run.stop();
  }
}

/** The `rl` command: launch, follow, summarise (with its evals and report), clean up. */
export async function runRl(config: RLConfig): Promise<void> {
  const run = await launchRun(config);
  const wandb = await startWandb({
    settings: config.wandb, runName: config.run_name, runDir: run.layout.dir, metricsFile: run.layout.metricsFile, config,
    say: (line) => process.stderr.write(`${line}\n`),
  });
  try {
    await followRl(run, config);
  } finally {
    await wandb?.close();
  }
}

function followRl(run: LocalRun<RLResult>, config: RLConfig): Promise<void> {
  return follow(run, config.run_name, (result) => {
    const evals = readEvalResults(result.runDir);
    process.stdout.write(
      `run ${config.run_name} ${result.stoppedEarly ? 'stopped' : 'completed'}: ${result.steps} steps, last reward ${result.lastReward?.toFixed(3) ?? '-'}\n` +
        (evals.length > 0 ? `${renderEvalTable(evals)}\n` : '') +
        `  run folder: ${result.runDir}\n  metrics:    ${run.layout.metricsFile}\n  report:     ${writeReport(result.runDir)}\n`,
    );
  });
}

/** The `sft` command. */
export async function runSft(config: SFTConfig): Promise<void> {
  const run = await launchSft(config);
  await follow(run, config.run_name, (result) => {
    const m = result.lastTrain?.metrics;
    process.stdout.write(
      `sft ${config.run_name} ${result.reachedTarget ? `reached val.target_loss ${config.val.target_loss}` : result.stoppedEarly ? 'stopped' : 'completed'}: ${result.steps} steps, last loss ${m?.loss.toFixed(4) ?? '-'}, val loss ${result.lastValLoss?.toFixed(4) ?? '-'}\n` +
        `  run folder: ${result.runDir}\n  weights:    ${result.weightsDir ?? '-'}\n  report:     ${writeReport(result.runDir)}\n`,
    );
  });
}

/** The `eval` command: the results table, and where the files are. */
export async function runEval(config: EvalConfig): Promise<void> {
  const run = await launchEval(config);
  await follow(run, config.run_name, (result) => {
    process.stdout.write(`${renderEvalTable(result.results)}\n  results: ${path.join(result.runDir, 'eval')}\n`);
  });
}
