/** `worker`: one process of a pool (cpu, trainer or inference) of a run spread over machines. */
import { z } from 'zod';
import { outputDir, positiveInt, runNameString, threads } from './common';
import { trainerRankSchema } from './dist';
import { inferenceSchema } from './inference';
import { temporalSchema } from './temporal';

/** Keys of `worker` that also fill its `inference` section (the server follows --output-dir). */
export const WORKER_SHARED_KEYS = ['output_dir', 'threads'] as const;
export const WORKER_SECTIONS = ['inference'] as const;

export const workerSchema = z.strictObject({
  pool: z
    .enum(['cpu', 'trainer', 'inference'])
    .describe('cpu and trainer poll their task queues; inference serves HTTP'),
  run_name: runNameString()
    .optional()
    .describe(
      "cpu and trainer pools: the run this worker serves; it polls the run's task queues, prime-rl.<run_name>.cpu or .trainer (temporal.task_queue, if set, names them instead)",
    ),
  output_dir: outputDir(),
  threads: threads(),
  env_workers: positiveInt().default(2).describe('cpu pool: child processes that run environment code'),
  env_timeout_s: z
    .number()
    .positive()
    .default(60)
    .describe('cpu pool: seconds before an environment call counts as hung'),
  metrics_address: z
    .string()
    .regex(/^(\[[0-9a-fA-F:.]+\]|[^\s:/]+):\d{1,5}$/, 'host:port')
    .optional()
    .describe(
      "cpu and trainer pools: host:port of this worker's Prometheus endpoint (/metrics) of Temporal SDK metrics: task slots, poll and schedule-to-start latencies, activity execution latencies and failures by activity type and task queue; unset = none",
    ),
  temporal: temporalSchema,
  inference: inferenceSchema.optional().describe('inference pool: the server to run'),
  trainer: trainerRankSchema.describe('trainer pool: this rank of the data-parallel trainer'),
});

export type WorkerConfig = z.output<typeof workerSchema>;
