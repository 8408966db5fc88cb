/**
 * `prime-rl runs list|show|pause|resume|stop [RUN]`: find and steer runs on the Temporal server.
 * The same can be done with the Temporal CLI (`temporal workflow signal --workflow-id RUN --name pause`,
 * `temporal workflow query --workflow-id RUN --type progress`).
 */
import { Client } from '@temporalio/client';
import { z } from 'zod';
import { ConfigError, describeFailure } from '../failures';
import { loadConfig } from '../config/loader';
import { evalSchema, rlSchema, sftSchema, temporalCommandSchema } from '../config/schemas';
import { connectClient, requireServer, temporalTarget } from '../temporal/connection';
import { command, type Command } from './command';

const runSchema = temporalCommandSchema.extend({
  run: z.string().min(1).optional().describe('run name (the workflow id); also accepted as the first argument'),
});
type RunsConfig = z.output<typeof runSchema>;

/** A client of the configured server (or the local dev server, which must be running: `runs` starts none). */
async function withClient<T>(c: RunsConfig, fn: (client: Client) => Promise<T>): Promise<T> {
  const target = temporalTarget(c.temporal);
  await requireServer(target);
  const connection = await connectClient(target);
  try {
    return await fn(new Client({ connection, namespace: target.namespace }));
  } finally {
    await connection.close();
  }
}

const needRun = (c: RunsConfig): string => {
  if (!c.run) throw new ConfigError('which run? give its name: prime-rl runs <show|pause|resume|stop> RUN');
  return c.run;
};

function signal(name: 'pause' | 'resume' | 'stop', summary: string): Command {
  return command({
    summary,
    schema: runSchema,
    positional: 'run',
    run: (c) =>
      withClient(c, async (client) => {
        await client.workflow.getHandle(needRun(c)).signal(name);
        process.stdout.write(`sent ${name} to ${c.run}\n`);
      }),
  });
}

const startSchema = z.strictObject({
  config: z
    .string()
    .min(1)
    .describe("the run's resolved config (what --dry-run FILE writes); also accepted as the first argument"),
  kind: z.enum(['rl', 'sft', 'eval']).describe('what the config is for: rl, sft or eval'),
});

/**
 * `runs start`: a run whose processes run elsewhere (a SLURM job's steps, workers started by
 * hand): starts its workflow (or re-attaches to it) on the server its config names, and follows it
 * to its end as `rl`, `sft` and `eval` do; starts no process and no dev server.
 */
async function startRun(c: z.output<typeof startSchema>): Promise<void> {
  // Read as the command reads a config file (a key it does not know is an error naming it).
  const load = <S extends z.ZodType>(schema: S) => loadConfig({ schema, argv: ['@', c.config], env: {} }).config;
  const opts = { external: true };
  if (c.kind === 'rl') return (await import('../launch/rl')).runRl(load(rlSchema), opts);
  if (c.kind === 'sft') return (await import('../launch/sft')).runSft(load(sftSchema), opts);
  return (await import('../launch/eval')).runEval(load(evalSchema), opts);
}

export const runsCommands: Record<string, Command> = {
  start: command({
    summary: 'start a run whose workers run elsewhere (SLURM, by hand) from its resolved config, and follow it',
    schema: startSchema,
    positional: 'config',
    run: startRun,
  }),
  list: command({
    summary: 'list runs (rl, sft and eval workflows)',
    schema: runSchema,
    run: (c) =>
      withClient(c, async (client) => {
        const rows: string[] = [];
        for await (const w of client.workflow.list({ query: "WorkflowType IN ('rl', 'sft', 'eval')" })) {
          rows.push(
            `${w.workflowId.padEnd(24)} ${w.type.padEnd(5)} ${w.status.name.padEnd(12)} ${w.startTime.toISOString()}`,
          );
        }
        process.stdout.write(
          rows.length ? `${'RUN'.padEnd(24)} TYPE  STATUS       STARTED\n${rows.join('\n')}\n` : 'no runs\n',
        );
      }),
  }),
  show: command({
    summary: 'status and progress of a run',
    schema: runSchema,
    positional: 'run',
    run: (c) =>
      withClient(c, async (client) => {
        const handle = client.workflow.getHandle(needRun(c));
        const d = await handle.describe();
        const progress = d.status.name === 'RUNNING' ? await handle.query('progress') : undefined;
        // Why a failed run failed: the activity and its error, as `rl` printed it.
        const failure =
          d.status.name === 'FAILED'
            ? await handle.result().then(
                () => undefined,
                (e: Error) => describeFailure(e).message,
              )
            : undefined;
        // Activities being retried (a worker or server down, a bug): the attempt and its last error.
        const retrying = (d.raw.pendingActivities ?? [])
          .filter((a) => (a.attempt ?? 1) > 1)
          .map((a) => ({
            activity: a.activityType?.name,
            attempt: a.attempt,
            last_failure: a.lastFailure?.message ?? undefined,
          }));
        process.stdout.write(
          `${JSON.stringify({ run: d.workflowId, type: d.type, status: d.status.name, started: d.startTime, memo: d.memo, failure, retrying: retrying.length > 0 ? retrying : undefined, progress }, null, 2)}\n`,
        );
      }),
  }),
  pause: signal('pause', 'pause a run before its next step'),
  resume: signal('resume', 'resume a paused run'),
  stop: signal('stop', 'finish the steps in flight, then end the run'),
};
