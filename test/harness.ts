/**
 * The in-process stack the workflow tests run on: a real Temporal dev server on free ports and
 * real cpu (and trainer) workers polling it, created fresh for each workflow execution.
 */
import * as path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { DefaultLogger, NativeConnection, Runtime, Worker } from '@temporalio/worker';
import { createCpuActivities, createTrainerActivities } from '../activities';
import type { EnvPool } from '../lib/envs/pool';
import { freePort } from '../lib/net';
import { startDevServer, type TemporalEndpoint } from '../lib/temporal/devserver';

Runtime.install({ logger: new DefaultLogger('WARN') });

/** A Temporal dev server with its database and log in `dir`. */
export async function startTemporal(dir: string): Promise<TemporalEndpoint> {
  const [port, uiPort] = [await freePort(), await freePort()];
  const started = await startDevServer({
    ip: '127.0.0.1', port, uiPort, namespace: 'default', dbFile: path.join(dir, 'temporal.db'), logFile: path.join(dir, 'temporal.log'),
  });
  return started.endpoint;
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
}

/** Runs a workflow to its end on fresh in-process workers (so a trainer starts with no state). */
export async function execute<T>(e: Execution): Promise<T> {
  const connection = await NativeConnection.connect({ address: e.temporal.address });
  const cpuQueue = `${e.taskQueue}.cpu`;
  const cpu = await Worker.create({ connection, taskQueue: cpuQueue, workflowsPath: require.resolve('../workflows'), activities: createCpuActivities({ pool: e.pool }) });
  const client = new Client({ connection: await Connection.connect({ address: e.temporal.address }) });
  try {
    const run = client.workflow.execute(e.workflowType, { taskQueue: cpuQueue, workflowId: e.workflowId, args: e.args }) as Promise<T>;
    if (!e.trainer) return await cpu.runUntil(run);
    const trainer = await Worker.create({
      connection, taskQueue: `${e.taskQueue}.trainer`, activities: createTrainerActivities(), maxConcurrentActivityTaskExecutions: 1,
    });
    return await cpu.runUntil(trainer.runUntil(run));
  } finally {
    await client.connection.close();
    await connection.close();
  }
}
