/**
 * `prime-rl rl|sft|eval` on one machine: a Temporal server (the configured one, or a local dev
 * server: devserver-policy.ts), the processes the workflow needs as child processes (rl: inference
 * server, cpu and trainer workers; sft: cpu and trainer; eval: cpu, plus the inference server unless
 * it evaluates an external API), logs in `<run>/logs/`, restarted whenever they die or stop
 * answering for `temporal.heartbeat_timeout_s` (supervise.ts); then the workflow, started under the run name or re-attached to if it is already
 * running, with a live progress line until it completes. Ctrl-C stops the local processes and
 * leaves the workflow where it is: the same command resumes it. A launcher killed outright
 * (SIGKILL, OOM) takes its processes with it: each watches a pipe from it and stops when it closes.
 * `<run>/launcher.json` records the launcher and its processes (pid + start time), so the same
 * command, run again, stops any that linger and takes over the Temporal dev server the killed
 * launcher started (which stays up: other commands may use it).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  Client,
  type Connection,
  WorkflowExecutionAlreadyStartedError,
  WorkflowNotFoundError,
} from '@temporalio/client';
import {
  replicaServers,
  serverUrl,
  trainerRankSchema,
  type InferenceConfig,
  type RunTemporalConfig,
  type TrainerRankConfig,
  type WorkerConfig,
} from '../config/schemas';
import { DISK_FULL } from '../atomic';
import { CommandError, ConfigError } from '../failures';
import { RunLayout } from '../runfolder/layout';
import { freePort } from '../net';
import { isRunning, processId, terminateProcess, type ProcessId } from '../proc';
import {
  connectClient,
  describeTarget,
  otherRunningWorkflows,
  requireServer,
  temporalTarget,
} from '../temporal/connection';
import { isListening } from '../temporal/devserver';
import { taskQueues } from '../temporal/queues';
import { checkWorldSize, newDistToken } from '../trainer/group';
import { acquireDevServer, releaseDevServer, type OwnedDevServer } from './devserver-policy';
import { SilentServers } from './silence';
import { jobStep } from './slurm';
import {
  cliProcess,
  readLauncherRecord,
  Supervised,
  writeJson,
  type LauncherRecord,
  type Liveness,
  type Pool,
} from './supervise';

/** What to launch: the workflow, and the local processes it needs. */
export interface LaunchSpec {
  runName: string;
  outputDir: string;
  temporal: RunTemporalConfig;
  /** The inference server to run, if the workflow samples from one. */
  inference?: InferenceConfig;
  /** Worker pools to run. */
  pools: ('cpu' | 'trainer')[];
  worker: Pick<WorkerConfig, 'env_workers' | 'env_timeout_s' | 'threads'>;
  /** The trainer's ranks: world_size trainer workers (rank 0 + followers) on this machine. */
  trainer?: Pick<TrainerRankConfig, 'world_size' | 'dist'>;
  workflowType: 'rl' | 'sft' | 'eval';
  args: unknown[];
  memo: Record<string, unknown>;
  /** The progress line, from the workflow's `progress` query; none = no progress line. */
  progressLine?: (progress: never, rate: { started: number; first?: number }) => string;
  /**
   * The inference servers the workflow samples from (`http://host:port`), watched by the progress
   * line (silence.ts); default: the ones this launch runs.
   */
  samplesFrom?: string[];
}

/** How a launch runs. */
export interface LaunchOptions {
  /** No progress line or launcher lines on stderr (tests). */
  quiet?: boolean;
  /**
   * The run's processes run elsewhere (a SLURM job's steps, started by hand): start none, and
   * no dev server; only start (or re-attach to) the workflow and follow it (`prime-rl runs start`).
   */
  external?: boolean;
  /**
   * Inside a SLURM job ([slurm], lib/launch/slurm.ts): each process is a job step of its own
   * (srun), started again by its supervision when the step ends.
   */
  jobSteps?: boolean;
}

export interface LocalRun<R> {
  layout: RunLayout;
  /** The local processes, for tests that kill them (no pid: not run for this workflow). */
  processes: Record<Pool, { pid?: number; restarts: number }>;
  /** Trainer ranks 1..world_size-1 (rank 0 is `processes.trainer`). */
  followers: { pid?: number; restarts: number }[];
  result: Promise<R>;
  stop(): Promise<void>;
}

/** How long a re-run waits for the inference port a killed launcher's server still holds. */
const PORT_WAIT_MS = 30_000;
/** How long one progress line may wait for Temporal's answers. */
const PROGRESS_DEADLINE_MS = 10_000;

/** What Temporal's description says of a pending activity (the fields the progress line reads). */
interface PendingActivity {
  activityType?: { name?: string | null } | null;
  attempt?: number | null;
  lastFailure?: { message?: string | null; applicationFailureInfo?: { type?: string | null } | null } | null;
}

/**
 * Why the run is not moving, for the progress line: the first activity Temporal is retrying, with
 * its attempt and last error; an activity failing on a full disk says that the run waits for
 * space (it resumes by itself once there is). Undefined while nothing is retried.
 */
export function retryNote(pending: readonly PendingActivity[]): string | undefined {
  const a = pending.find((p) => (p.attempt ?? 1) > 1 && p.lastFailure);
  if (!a) return undefined;
  const message = (a.lastFailure!.message ?? '').split('\n')[0];
  if (a.lastFailure!.applicationFailureInfo?.type === DISK_FULL) return `waiting for disk space: ${message}`;
  const cut = message.length > 160 ? `${message.slice(0, 157)}...` : message;
  return `retrying ${a.activityType?.name ?? 'an activity'} (attempt ${a.attempt}): ${cut}`;
}

/** Starts everything a workflow needs locally and the workflow; `result` settles when it completes. */
export async function launch<R>(spec: LaunchSpec, opts: LaunchOptions = {}): Promise<LocalRun<R>> {
  const layout = RunLayout.of(spec.outputDir, spec.runName);
  // The server and how to reach it (TEMPORAL_*, temporal.toml, temporal.*): a bad profile is a
  // config error before anything starts.
  const target = temporalTarget(spec.temporal);
  fs.mkdirSync(layout.logsDir, { recursive: true });
  const say = (line: string) => {
    if (!opts.quiet) process.stderr.write(`${line}\n`);
    try {
      fs.appendFileSync(path.join(layout.logsDir, 'launcher.log'), `${new Date().toISOString()} ${line}\n`);
    } catch {
      // A full disk loses the log line, never the launcher (the progress line says so).
    }
  };

  // Another launcher of this run still running (another terminal, or this process) owns its processes.
  const previous = readLauncherRecord(layout);
  if (previous && isRunning(previous.launcher)) {
    throw new CommandError(
      `run ${spec.runName} is already launched by process ${previous.launcher.pid} (${layout.launcherFile}); stop that one (Ctrl-C, or kill ${previous.launcher.pid}) before launching it again`,
    );
  }
  // Processes of a killed launcher exit on their own (see cliProcess); one that has not yet (still
  // draining, or stuck) is stopped here: it would hold its port, or poll our task queues.
  await Promise.all(
    Object.entries(previous?.processes ?? {})
      .filter((e): e is [string, ProcessId] => e[1] !== undefined && isRunning(e[1]))
      .map(([name, id]) => {
        say(
          `stopping ${name} (pid ${id.pid}), left running by the killed launcher ${previous!.launcher.pid} of this run`,
        );
        return terminateProcess(id, 10_000);
      }),
  );

  if (spec.pools.includes('trainer') && !opts.external) checkWorldSize(spec.trainer ?? trainerRankSchema.parse({}));

  // The run's own inference servers must get their ports: were another process (another run's
  // server) answering there, rollouts would silently come from that server's model. After a killed
  // launcher a port may still be held a while (its server's last threads exiting): waited for, with
  // a deadline.
  const servers = spec.inference && !opts.external ? replicaServers(spec.inference) : [];
  const deadline = Date.now() + (previous ? PORT_WAIT_MS : 0);
  for (const http of servers) {
    if (http.port === 0) continue;
    const host = http.host === '0.0.0.0' ? '127.0.0.1' : http.host;
    for (let said = false; await isListening(host, http.port); said = true) {
      if (Date.now() >= deadline)
        throw new ConfigError(
          `inference.server.port: ${http.host}:${http.port} is already in use${previous ? ` (still, ${PORT_WAIT_MS / 1000} s after the killed launcher's processes were stopped)` : ''} (another run's inference server?); choose a free port with --inference.server.port (in rl, orchestrator.base_urls follows it unless set)`,
        );
      if (!said)
        say(`waiting for ${http.host}:${http.port}, still held since the killed launcher ${previous!.launcher.pid}`);
      await sleep(250);
    }
  }

  const self = processId(process.pid)!;
  const record: LauncherRecord = { launcher: self, processes: {} };
  const saveRecord = () => writeJson(layout.launcherFile, record);
  saveRecord();

  let temporal: OwnedDevServer | undefined;
  /** The run's task queue prefix: its own, or that of its running workflow when re-attaching (below). */
  let queuePrefix = spec.temporal.task_queue;
  // A local process silent this long is hung: killed, and so restarted (supervise.ts).
  const liveness: Liveness = { deadlineMs: spec.temporal.heartbeat_timeout_s * 1000 };

  const children: Partial<Record<Pool, Supervised>> = {};
  const followers: Supervised[] = [];
  const replicas: Supervised[] = [];
  /** The run's local processes: inference server (if any) and worker pools, each supervised. */
  const spawnChildren = async () => {
    const configs = path.join(layout.dir, 'configs');
    const worldSize = spec.trainer?.world_size ?? 1;
    const dist = spec.trainer?.dist ?? trainerRankSchema.parse({}).dist;
    // Local ranks rendezvous on a port picked now unless the config names one.
    const trainerDist = worldSize > 1 && dist.port === 0 ? { ...dist, port: await freePort() } : dist;
    // The workers reach the server as this process does: the same keys, and the environment
    // (TEMPORAL_*) they inherit. No secret is written into their config files.
    const workerBase: Omit<WorkerConfig, 'pool'> = {
      output_dir: spec.outputDir,
      ...spec.worker,
      temporal: { ...spec.temporal, task_queue: queuePrefix },
      trainer: { rank: 0, world_size: worldSize, dist: trainerDist },
    };
    const step = (name: string) => (opts.jobSteps ? (argv: string[]) => jobStep(name, argv) : undefined);
    const recorded = (pool: keyof LauncherRecord['processes']) => (id: ProcessId) => {
      record.processes[pool] = id;
      try {
        saveRecord();
      } catch (e) {
        // A full disk: the process runs unrecorded (a re-run after a kill would not find it).
        say(`could not record ${pool} (pid ${id.pid}) in ${layout.launcherFile}: ${(e as Error).message}`);
      }
    };
    // inference.replicas servers, each on its own port: `inference`, then `inference-1`, ...
    servers.forEach((server, i) => {
      const name = i === 0 ? 'inference' : (`inference-${i}` as const);
      const supervised = new Supervised(
        i === 0 ? 'inference' : `inference replica ${i}`,
        cliProcess(
          ['inference', '@', writeJson(path.join(configs, `${name}.json`), { ...spec.inference, server, replicas: 1 })],
          path.join(layout.logsDir, `${name}.log`),
          {},
          step(name),
        ),
        say,
        recorded(name),
        undefined,
        liveness,
      );
      if (i === 0) children.inference = supervised;
      else replicas.push(supervised);
    });
    // The ranks' shared token (lib/trainer/group.ts): the user's, or a fresh one for these ranks.
    const rankEnv: Record<string, string> =
      worldSize > 1 && !process.env[dist.token_var] ? { [dist.token_var]: newDistToken() } : {};
    const logName = { cpu: 'orchestrator.log', trainer: 'trainer.log' } as const;
    for (const pool of spec.pools) {
      const file = writeJson(path.join(configs, `worker-${pool}.json`), { ...workerBase, pool });
      children[pool] = new Supervised(
        `${pool} worker`,
        cliProcess(
          ['worker', '@', file],
          path.join(layout.logsDir, logName[pool]),
          pool === 'trainer' ? rankEnv : {},
          step(pool),
        ),
        say,
        recorded(pool),
        undefined,
        liveness,
      );
    }
    if (!spec.pools.includes('trainer')) return;
    for (let rank = 1; rank < worldSize; rank++) {
      const name = `trainer-${rank}` as const;
      const file = writeJson(path.join(configs, `worker-${name}.json`), {
        ...workerBase,
        pool: 'trainer',
        trainer: { ...workerBase.trainer, rank },
      });
      followers.push(
        new Supervised(
          `trainer rank ${rank}`,
          cliProcess(['worker', '@', file], path.join(layout.logsDir, `${name}.log`), rankEnv, step(name)),
          say,
          recorded(name),
          undefined,
          liveness,
        ),
      );
    }
  };

  const stop = async () => {
    await Promise.all([...Object.values(children), ...followers, ...replicas].map((c) => c.stop()));
    if (temporal) await releaseDevServer(temporal, target, spec.outputDir, spec.runName, say);
    fs.rmSync(layout.launcherFile, { force: true });
  };

  let opened: Connection | undefined;
  try {
    if (opts.external) await requireServer(target);
    else temporal = await acquireDevServer(spec.temporal, target, spec.outputDir, self, say, liveness.deadlineMs);
    if (target.configured) say(`Temporal at ${describeTarget(target)}`);

    const connection = (opened = await connectClient(target));
    const client = new Client({ connection, namespace: target.namespace });
    const workflowId = spec.runName;
    let handle = client.workflow.getHandle<(...args: unknown[]) => Promise<R>>(workflowId);
    // Re-attach only to this very run: same workflow type and same run folder. Two output dirs
    // may hold runs of the same name, and one Temporal server sees both under one workflow id.
    const checkAttachable = async (): Promise<boolean> => {
      const d = await handle.describe();
      if (d.status.name !== 'RUNNING') return false;
      if (d.type !== spec.workflowType)
        throw new Error(
          `workflow ${workflowId} is a running ${d.type} run, not ${spec.workflowType}: use another run_name`,
        );
      const runDir = (d.memo as { runDir?: unknown } | undefined)?.runDir;
      if (runDir !== path.resolve(layout.dir))
        throw new Error(
          `workflow ${workflowId} is running for run folder ${String(runDir)}, not ${path.resolve(layout.dir)}: use another run_name`,
        );
      // Its workers poll the queues it was started on (an execution started before per-run queues
      // were the default keeps the shared ones).
      const started = d.taskQueue.replace(/\.cpu$/, '');
      if (started !== queuePrefix)
        say(`workflow ${workflowId} runs on task queues ${started}.*; its workers poll them`);
      queuePrefix = started;
      return true;
    };
    let running = false;
    try {
      running = await checkAttachable();
    } catch (e) {
      if (!(e instanceof WorkflowNotFoundError)) throw e;
    }
    // Runs never share workers: a queue another running workflow uses is refused.
    const cpuQueue = taskQueues(queuePrefix).cpu;
    const sharing = await otherRunningWorkflows(client, workflowId, `TaskQueue = "${cpuQueue}"`);
    if (sharing.length > 0)
      throw new ConfigError(
        `temporal.task_queue: ${queuePrefix} is the task queue prefix of running workflow ${sharing.join(', ')}, whose workers would take this run's activities (and it theirs); give each run its own (unset = prime-rl.<run_name>)`,
      );
    // Checked before any process starts, so a refused launch leaves nothing behind.
    if (!opts.external) await spawnChildren();
    if (running) say(`re-attached to running workflow ${workflowId}`);
    else {
      try {
        handle = await client.workflow.start<(...args: unknown[]) => Promise<R>>(spec.workflowType, {
          taskQueue: cpuQueue,
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
      // Named after half the liveness deadline (at most 10 s): a local server the supervisor kills
      // and restarts at the deadline is named on the line before that.
      const silence = new SilentServers(
        spec.samplesFrom ?? servers.map((s) => serverUrl(s)),
        Math.min(10_000, liveness.deadlineMs / 2),
      );
      // One progress query at a time: while Temporal restarts, a query retries inside the client,
      // and it must have settled before the connection closes (or its retry hits a closed channel).
      // Bounded: a frozen server answers nothing, and the line waits for the next tick.
      let inflight: Promise<void> | undefined;
      const showProgress = async (render: NonNullable<typeof line>) => {
        try {
          const [[progress, described]] = await Promise.all([
            connection.withDeadline(Date.now() + PROGRESS_DEADLINE_MS, () =>
              Promise.all([handle.query('progress'), handle.describe()]),
            ),
            silence.probe(),
          ]);
          const notes = [retryNote(described.raw.pendingActivities ?? []), silence.note()].filter(Boolean);
          const line = render(progress as never, rate);
          const text = notes.length ? `${line.replace(/ \| $/, '')} | ${notes.join(' | ')}` : line;
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
    const processes = {
      temporal: proc(temporal?.process),
      inference: proc(children.inference),
      cpu: proc(children.cpu),
      trainer: proc(children.trainer),
    };
    return { layout, processes, followers: followers.map((f) => proc(f)), result, stop };
  } catch (e) {
    await opened?.close();
    await stop();
    throw e;
  }
}
