/**
 * [temporal]: the Temporal server a command uses or starts, and the `temporal` commands' own schema.
 *
 * Where the server is and how to reach it (TLS, API key) comes first from Temporal's own
 * environment configuration, the TEMPORAL_* variables and the temporal.toml profiles the Temporal
 * CLI and SDKs share (lib/temporal/connection.ts); `address`, `namespace` and `profile` here
 * override it. Secrets have no key here: a config is a workflow's input, kept in its history.
 */
import { z } from 'zod';
import { outputDir, section } from './common';

const queueName = () => z.string().regex(/^[A-Za-z0-9._-]+$/, 'letters, digits, ., _ and - only');

export const temporalSchema = section({
  address: z
    .string()
    .min(1)
    .optional()
    .describe(
      'host:port of the Temporal server, over TEMPORAL_ADDRESS and the temporal.toml profile; none anywhere = the local dev server (rl, sft and eval start one)',
    ),
  namespace: z
    .string()
    .min(1)
    .optional()
    .describe("Temporal namespace, over TEMPORAL_NAMESPACE and the profile's; none anywhere = default"),
  profile: z
    .string()
    .min(1)
    .optional()
    .describe(
      'profile of Temporal\'s config file (TEMPORAL_CONFIG_FILE, else ~/.config/temporalio/temporal.toml), over TEMPORAL_PROFILE; unset = "default"',
    ),
  ip: z.string().default('127.0.0.1').describe('interface the local dev server binds'),
  port: z.number().int().min(1).max(65535).default(7233).describe('gRPC port of the local dev server'),
  ui_port: z.number().int().min(1).max(65535).default(8233).describe('web UI port of the local dev server'),
  metrics_port: z
    .number()
    .int()
    .min(1)
    .max(65535)
    .optional()
    .describe('Prometheus /metrics port of the local dev server; unset = the gRPC port + 2000 (9233)'),
  task_queue: queueName()
    .optional()
    .describe(
      "the run's task queue prefix: its workers poll <prefix>.cpu and <prefix>.trainer; unset = prime-rl.<run_name>, so runs on one server never share workers",
    ),
  heartbeat_timeout_s: z
    .number()
    .min(5)
    .default(60)
    .describe(
      'silence this long means dead: an activity whose worker sent no heartbeat is retried elsewhere, the launcher restarts a local process that stopped answering, an inference server or teacher that answers nothing (not even /health) has its requests moved',
    ),
}).superRefine((t, ctx) => {
  if (devMetricsPort(t) > 65535)
    ctx.addIssue({
      code: 'custom',
      path: ['metrics_port'],
      message: `unset, it is the gRPC port + 2000 (${devMetricsPort(t)}), which is no port: set temporal.metrics_port`,
    });
});

export type TemporalConfig = z.output<typeof temporalSchema>;
/** The temporal section of a run (rl, sft, eval): its task queue prefix resolved. */
export type RunTemporalConfig = TemporalConfig & { task_queue: string };

/** The task queue prefix of run `runName` when temporal.task_queue does not name one. */
export const runTaskQueue = (runName: string): string => `prime-rl.${runName}`;

/** A run's config with its task queue resolved, so that --dry-run shows (and the workflow gets) the queues used. */
export function withRunQueue<T extends { run_name: string; temporal: TemporalConfig }>(
  c: T,
): Omit<T, 'temporal'> & { temporal: RunTemporalConfig } {
  return { ...c, temporal: { ...c.temporal, task_queue: c.temporal.task_queue ?? runTaskQueue(c.run_name) } };
}

/** The local dev server's metrics port: temporal.metrics_port, else the gRPC port + 2000. */
export function devMetricsPort(t: Pick<TemporalConfig, 'port' | 'metrics_port'>): number {
  return t.metrics_port ?? t.port + 2000;
}

export const temporalCommandSchema = z.strictObject({
  output_dir: outputDir(),
  temporal: temporalSchema,
});

export type TemporalCommandConfig = z.output<typeof temporalCommandSchema>;
