/** [temporal]: the Temporal server a command uses or starts, and the `temporal` commands' own schema. */
import { z } from 'zod';
import { outputDir, section } from './common';

export const temporalSchema = section({
  address: z.string().optional().describe('host:port of a Temporal server; unset = reuse or start a local dev server'),
  namespace: z.string().default('default').describe('Temporal namespace'),
  ip: z.string().default('127.0.0.1').describe('interface the local dev server binds'),
  port: z.number().int().min(1).max(65535).default(7233).describe('gRPC port of the local dev server'),
  ui_port: z.number().int().min(1).max(65535).default(8233).describe('web UI port of the local dev server'),
  task_queue: z
    .string()
    .regex(/^[A-Za-z0-9._-]+$/)
    .default('prime-rl')
    .describe('task queue prefix: workers poll <prefix>.cpu and <prefix>.trainer'),
  heartbeat_timeout_s: z
    .number()
    .min(5)
    .default(60)
    .describe(
      'silence this long means dead: an activity whose worker sent no heartbeat is retried elsewhere, the launcher restarts a local process that stopped answering, an inference server or teacher that answers nothing (not even /health) has its requests moved',
    ),
});

export const temporalCommandSchema = z.strictObject({
  output_dir: outputDir(),
  temporal: temporalSchema,
});

export type TemporalConfig = z.output<typeof temporalSchema>;
export type TemporalCommandConfig = z.output<typeof temporalCommandSchema>;
