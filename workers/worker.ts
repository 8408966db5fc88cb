/**
 * A worker process of one pool. `cpu` polls `<prefix>.cpu` (the workflows and the orchestrator
 * activities, with a pool of environment processes); `trainer` polls `<prefix>.trainer` (one
 * activity at a time: the model and optimizer live in this process); `inference` is the policy
 * server, which cpu activities drive over HTTP. SIGTERM / SIGINT drain and exit 0.
 * A data-parallel trainer (`--trainer.world-size N`) is N trainer workers: rank 0 polls the queue
 * and drives ranks 1..N-1, which only follow it through the c10d store (lib/trainer/group.ts).
 */
import { NativeConnection, Runtime, DefaultLogger, Worker } from '@temporalio/worker';
import { createCpuActivities, createTrainerActivities } from '../activities';
import { logActivities } from '../activities/log';
import type { WorkerConfig } from '../lib/config/schemas';
import { ConfigError } from '../lib/failures';
import { announceReady } from '../lib/proc';
import { EnvPool } from '../lib/envs/pool';
import { runInference } from '../lib/cli/inference';
import { repackStepBatch } from '../lib/orchestrator/repack';
import { runTaskQueue } from '../lib/config/schemas';
import { withDeadline } from '../lib/deadline';
import {
  CONNECT_TIMEOUT_MS,
  connectFailure,
  describeTarget,
  requireServer,
  temporalTarget,
  type TemporalTarget,
} from '../lib/temporal/connection';
import { taskQueues } from '../lib/temporal/queues';
import { checkWorldSize, GroupLeader, runFollower, type RankGroup } from '../lib/trainer/group';
import { RankTrainer } from '../lib/trainer/ranks';
import * as native from '../native';
import { workflowCode } from './bundle';

/** Rank 1..N-1 of the data-parallel trainer: follows rank 0 until SIGTERM / SIGINT. */
async function runFollowerRank(config: WorkerConfig): Promise<void> {
  if (config.threads) native.setThreads(config.threads);
  const ranks = new RankTrainer(repackStepBatch);
  let current: RankGroup | undefined;
  let stopping = false;
  const stop = () => void (stopping = true);
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  const t = config.trainer;
  process.stdout.write(
    `worker trainer rank ${t.rank} of ${t.world_size} following rank 0 at ${t.dist.host}:${t.dist.port}\n`,
  );
  announceReady();
  await runFollower(t, {
    execute: async (job, group) => {
      if (current !== group) ranks.setGroup((current = group));
      await ranks.follow(job);
    },
    reset: () => ranks.setGroup((current = undefined)),
    log: (line) => process.stdout.write(`${line}\n`),
    stopped: () => stopping,
  });
}

/** The worker's connection to its server, or the error that says what to set (TLS, API key, address). */
async function connect(target: TemporalTarget): Promise<NativeConnection> {
  await requireServer(target);
  try {
    return await withDeadline(`connecting to Temporal at ${target.address}`, CONNECT_TIMEOUT_MS, () =>
      NativeConnection.connect({ address: target.address, ...target.secrets }),
    );
  } catch (e) {
    throw connectFailure(e, target);
  }
}

/** The task queue prefix a cpu or trainer worker polls: temporal.task_queue, else its run's. */
function queuePrefix(config: WorkerConfig): string {
  if (config.temporal.task_queue !== undefined) return config.temporal.task_queue;
  if (config.run_name !== undefined) return runTaskQueue(config.run_name);
  throw new ConfigError(
    `run_name: which run does this ${config.pool} worker serve? --run-name NAME polls that run's queues (${runTaskQueue('NAME')}.${config.pool}); --temporal.task-queue PREFIX names them instead`,
  );
}

export async function runWorker(config: WorkerConfig): Promise<void> {
  if (config.pool === 'inference') {
    if (!config.inference)
      throw new ConfigError(
        '--pool inference needs the server config: --inference.model.name DIR (or --inference @ file.toml)',
      );
    return runInference(config.inference);
  }
  if (config.pool === 'trainer') checkWorldSize(config.trainer);
  if (config.pool === 'trainer' && config.trainer.rank > 0) return runFollowerRank(config);
  const queues = taskQueues(queuePrefix(config));
  const target = temporalTarget(config.temporal);
  const leader =
    config.pool === 'trainer' && config.trainer.world_size > 1 ? await GroupLeader.start(config.trainer) : undefined;
  // Activities' start and end at info (activities/log.ts), the SDK core's own lines from warn;
  // the SDK's metrics on a Prometheus endpoint when asked.
  Runtime.install({
    logger: new DefaultLogger('INFO'),
    telemetryOptions: {
      logging: { filter: { core: 'WARN', other: 'ERROR' }, forward: {} },
      ...(config.metrics_address && { metrics: { prometheus: { bindAddress: config.metrics_address } } }),
    },
  });
  const connection = await connect(target);
  let pool: EnvPool | undefined;
  let worker: Worker;
  if (config.pool === 'cpu') {
    pool = new EnvPool({ workers: config.env_workers, timeoutS: config.env_timeout_s });
    worker = await Worker.create({
      connection,
      namespace: target.namespace,
      taskQueue: queues.cpu,
      // Prebuilt by `npm run build:ts` (./bundle.ts): webpack at every start would take seconds.
      workflowBundle: await workflowCode((line) => process.stdout.write(`${line}\n`)),
      activities: createCpuActivities({ pool }),
      interceptors: { activity: [logActivities] },
    });
  } else {
    if (config.threads) native.setThreads(config.threads);
    worker = await Worker.create({
      connection,
      namespace: target.namespace,
      taskQueue: queues.trainer,
      activities: createTrainerActivities({ leader }),
      // The trainer holds one model in memory: activities must not interleave.
      maxConcurrentActivityTaskExecutions: 1,
      interceptors: { activity: [logActivities] },
    });
  }
  process.stdout.write(
    `worker ${config.pool} polling ${config.pool === 'cpu' ? queues.cpu : queues.trainer} on ${describeTarget(target)}` +
      (leader
        ? ` (trainer rank 0 of ${config.trainer.world_size}, store at ${config.trainer.dist.host}:${leader.port})`
        : '') +
      (config.metrics_address ? `; metrics at http://${config.metrics_address}/metrics` : '') +
      '\n',
  );
  announceReady();
  const stop = () => worker.shutdown();
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  try {
    await worker.run();
  } finally {
    await pool?.close();
    await connection.close();
  }
}
