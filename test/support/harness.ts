/**
 * The in-process stack the workflow tests run on: a real Temporal dev server on free ports, an
 * environment pool, a real inference server when the workflow samples, and real cpu (and
 * trainer) workers polling the server, created fresh for each workflow execution.
 */
import * as path from 'node:path';
import { Client, Connection, type WorkflowHandle } from '@temporalio/client';
import type { Duration } from '@temporalio/common';
import { DefaultLogger, NativeConnection, Runtime, Worker, type WorkflowBundleOption } from '@temporalio/worker';
import { createCpuActivities, createTrainerActivities } from '../../activities';
import { inferenceSchema, type RLConfig } from '../../lib/config/schemas';
import { EnvPool } from '../../lib/envs/pool';
import { startInferenceServer, type InferenceServer } from '../../lib/inference/server';
import { freePort } from '../../lib/net';
import { InferenceClient, type GenerateParams, type GenerateResult } from '../../lib/orchestrator/client';
import { startDevServer, type TemporalEndpoint } from '../../lib/temporal/devserver';
import { taskQueues } from '../../lib/temporal/queues';
import type { RLResult } from '../../workflows/rl';
import { distWorkflowCode } from '../../workers/bundle';
import { removeDir } from './setup';

Runtime.install({ logger: new DefaultLogger('WARN') });

/** A Temporal dev server with its database and log in `dir`. */
export async function startTemporal(dir: string): Promise<TemporalEndpoint> {
  const [port, uiPort] = [await freePort(), await freePort()];
  const started = await startDevServer({
    ip: '127.0.0.1',
    port,
    uiPort,
    namespace: 'default',
    dbFile: path.join(dir, 'temporal.db'),
    logFile: path.join(dir, 'temporal.log'),
  });
  return started.endpoint;
}

export interface Stack {
  temporal: TemporalEndpoint;
  pool: EnvPool;
  close(): Promise<void>;
}

/** After a file's tests: closes its stack (if it started), then removes the folder the stack ran in. */
export async function closeStack(stack: Stack | undefined, root: string): Promise<void> {
  await stack?.close();
  removeDir(root);
}

/** A stack with an inference server. */
export type ServingStack = Stack & { inference: InferenceServer };

/** What the inference server of a stack serves. */
export interface Serve {
  modelDir: string;
  seqLen: number;
  /** More of the server's settings (inference section keys), e.g. max_queued, allowed_weight_roots. */
  settings?: Record<string, unknown>;
}

/** An inference server as a stack runs it (port 0, one thread), with `serve.settings` on top. */
export function startServer(root: string, serve: Serve): Promise<InferenceServer> {
  const { server, ...rest } = serve.settings ?? {};
  return startInferenceServer(
    inferenceSchema.parse({
      model: { name: serve.modelDir },
      seq_len: serve.seqLen,
      output_dir: path.join(root, 'outputs'),
      threads: 1,
      ...rest,
      server: { port: 0, ...(server as object | undefined) },
    }),
  );
}

/** A Temporal dev server in `root`, one env worker and, with `serve`, an inference server (port 0, one thread). */
export async function startStack(root: string): Promise<Stack>;
export async function startStack(root: string, serve: Serve): Promise<ServingStack>;
export async function startStack(root: string, serve?: Serve): Promise<Stack & { inference?: InferenceServer }> {
  const temporal = await startTemporal(root);
  const inference = serve ? await startServer(root, serve) : undefined;
  const stack = {
    temporal,
    pool: new EnvPool({ workers: 1, timeoutS: 30 }),
    inference,
    async close() {
      // The pool a test may have put in place of the first one (its workers and env servers).
      await stack.pool.close();
      await inference?.close(1000);
      await temporal.stop();
    },
  };
  return stack;
}

export interface Execution {
  temporal: TemporalEndpoint;
  pool: EnvPool;
  /** Task queue prefix (`temporal.task_queue` of the run's config). */
  taskQueue: string;
  workflowType: 'rl' | 'sft' | 'eval';
  workflowId: string;
  args: unknown[];
  /** Also run a trainer worker (rl and sft). */
  trainer: boolean;
  /** Runs while the workers are up, once the workflow has started (signals, queries). */
  drive?: (handle: WorkflowHandle) => Promise<void>;
  /** Bound on the whole workflow, for tests of runs that must fail rather than retry forever. */
  executionTimeout?: Duration;
}

let bundled: Promise<WorkflowBundleOption> | undefined;
/**
 * The workflows' bundle, once per test file: the one `npm run build:ts` left in dist/ while it is
 * newer than every file it was built from (the TypeScript sources included: workers/bundle.ts),
 * as the cpu worker runs it; else these sources bundled now (webpack, seconds under load), saying
 * so. The sources do not change while a file runs; each worker still starts from the bundle with
 * no state.
 */
const workflowBundle = () => (bundled ??= distWorkflowCode((line) => console.warn(line)));

/** Runs a workflow to its end on fresh in-process workers (so a trainer starts with no state). */
export async function execute<T>(e: Execution): Promise<T> {
  const connection = await NativeConnection.connect({ address: e.temporal.address });
  const queues = taskQueues(e.taskQueue);
  const cpu = await Worker.create({
    connection,
    taskQueue: queues.cpu,
    workflowBundle: await workflowBundle(),
    activities: createCpuActivities({ pool: e.pool }),
  });
  const client = new Client({ connection: await Connection.connect({ address: e.temporal.address }) });
  try {
    const run = (async () => {
      const handle = await client.workflow.start(e.workflowType, {
        taskQueue: queues.cpu,
        workflowId: e.workflowId,
        args: e.args,
        workflowExecutionTimeout: e.executionTimeout,
      });
      await e.drive?.(handle);
      return (await handle.result()) as T;
    })();
    if (!e.trainer) return await cpu.runUntil(run);
    const trainer = await Worker.create({
      connection,
      taskQueue: queues.trainer,
      activities: createTrainerActivities(),
      maxConcurrentActivityTaskExecutions: 1,
    });
    return await cpu.runUntil(trainer.runUntil(run));
  } finally {
    await client.connection.close();
    await connection.close();
  }
}

/**
 * Runs a `type` workflow on `cfg`: its task queue, workflow id its run name, args `[cfg]`, with a
 * trainer worker unless it is an eval; `more` overrides.
 */
export function executeRun<T>(
  where: { temporal: TemporalEndpoint; pool: EnvPool },
  type: Execution['workflowType'],
  cfg: { run_name: string; temporal: { task_queue: string } },
  more: Partial<Execution> = {},
): Promise<T> {
  return execute<T>({
    temporal: where.temporal,
    pool: where.pool,
    taskQueue: cfg.temporal.task_queue,
    workflowType: type,
    workflowId: cfg.run_name,
    args: [cfg],
    trainer: type !== 'eval',
    ...more,
  });
}

/** Runs an rl workflow on `cfg` (workflow id: its run name) with a trainer worker; `more` overrides. */
export const executeRl = (
  where: { temporal: TemporalEndpoint; pool: EnvPool },
  cfg: RLConfig,
  more: Partial<Execution> = {},
): Promise<RLResult> => executeRun<RLResult>(where, 'rl', cfg, more);

/** A real inference client that also records the prompt of each request it sends. */
export class RecordingClient extends InferenceClient {
  readonly prompts: number[][] = [];
  override async generate(promptIds: readonly number[], params: GenerateParams): Promise<GenerateResult> {
    this.prompts.push([...promptIds]);
    return super.generate(promptIds, params);
  }
}
