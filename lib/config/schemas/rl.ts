/**
 * `rl`: a whole RL run, the trainer, orchestrator and inference sections under one config, with
 * the keys they share and the checks that span sections.
 */
import { z } from 'zod';
import { isVerifiersEnv } from '../names';
import { serverUrl } from '../urls';
import { checkpointSchema } from './ckpt';
import { asyncLevel, checkMaxTokens, maxSteps, outputDir, runName, section, seed, seqLen } from './common';
import { trainEnvSchema } from './algorithm';
import { distills, distillSchema } from './distill';
import { evalSettings } from './eval';
import { inferenceSchema, replicaServers } from './inference';
import { orchestratorSchema } from './orchestrator';
import { temporalSchema, withRunQueue } from './temporal';
import { trainerSchema } from './trainer';
import { wandbSchema } from './wandb';
import { slurmSchema } from './slurm';
import { weightBroadcastSchema } from './weights';

/** Keys of `rl` that fill the trainer, orchestrator and inference sections (as prime-rl's `rl` command shares them). */
export const RL_SHARED_KEYS = ['model.name', 'seq_len', 'max_steps', 'async_level', 'output_dir', 'seed'] as const;
export const RL_SECTIONS = ['trainer', 'orchestrator', 'inference'] as const;
/**
 * Sections that may hold longer sequences than the run makes: the inference server (prime-rl's
 * vLLM max_model_len) and the trainer, whose rows of trainer.seq_len pack the orchestrator's
 * samples of at most seq_len (prime-rl's trainer model.seq_len).
 */
export const RL_SHARED_AT_LEAST = { seq_len: ['inference', 'trainer'] } as const;

export const rlSchema = z
  .strictObject({
    run_name: runName('rl'),
    model: section({
      name: z.string().min(1).optional().describe('model folder for trainer, orchestrator and inference'),
    }),
    seq_len: seqLen(),
    max_steps: maxSteps(),
    async_level: asyncLevel(),
    output_dir: outputDir(),
    seed: seed(),
    env: z
      .array(trainEnvSchema)
      .default([])
      .describe('training environments: [[env]] id, args, weight (and what they replace of the algorithm)'),
    ckpt: checkpointSchema,
    eval: evalSettings,
    temporal: temporalSchema,
    wandb: wandbSchema,
    weight_broadcast: weightBroadcastSchema,
    slurm: slurmSchema
      .optional()
      .describe(
        '[slurm]: submit the run as a SLURM batch job (lib/config/schemas/slurm.ts); --dry-run writes its script',
      ),
    distill: distillSchema,
    trainer: trainerSchema,
    orchestrator: orchestratorSchema,
    inference: inferenceSchema,
  })
  .superRefine((c, ctx) => {
    // Checked here, once, so the CLI refuses such a config (exit 2) and a run started with it from
    // elsewhere (`temporal workflow start`) fails when its stored config is read (readRunConfig).
    const o = c.orchestrator;
    if (o.batch_size % o.rollouts_per_example !== 0) {
      const lower = o.batch_size - (o.batch_size % o.rollouts_per_example);
      const options = [lower, lower + o.rollouts_per_example].filter((n) => n > 0).join(' or ');
      ctx.addIssue({
        code: 'custom',
        path: ['orchestrator', 'batch_size'],
        message: `${o.batch_size} is not a multiple of orchestrator.rollouts_per_example (${o.rollouts_per_example}): a step samples batch_size / rollouts_per_example examples, each rollouts_per_example times; use e.g. ${options}`,
      });
    }
    checkMaxTokens(
      ctx,
      ['orchestrator', 'sampling', 'max_tokens'],
      o.sampling.max_tokens,
      o.seq_len,
      'orchestrator.seq_len',
    );
    // Evals sample from the same inference server, within the orchestrator's seq_len.
    checkMaxTokens(
      ctx,
      ['eval', 'sampling', 'max_tokens'],
      c.eval.sampling.max_tokens,
      o.seq_len,
      'orchestrator.seq_len',
    );
    if (o.in_flight.enabled && c.eval.interval !== undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['eval', 'interval'],
        message:
          'evals between steps are not supported with orchestrator.in_flight.enabled (rollouts are generated continuously on the same servers): unset eval.interval, or run `prime-rl eval` on the weights afterwards',
      });
    }
    if (o.renderer !== undefined && ![...c.env, ...c.eval.env].some((e) => isVerifiersEnv(e.id)))
      ctx.addIssue({
        code: 'custom',
        path: ['orchestrator', 'renderer'],
        message:
          "is the renderer of verifiers environments' env servers, and this run has none: our own environments render with the model's chat template. Remove it, or train on a verifiers environment",
      });
    for (const k of ['initial_inflight', 'max_inflight'] as const) {
      const v = o.concurrency[k];
      if (v !== undefined && v < o.rollouts_per_example)
        ctx.addIssue({
          code: 'custom',
          path: ['orchestrator', 'concurrency', k],
          message: `${v} is below orchestrator.rollouts_per_example (${o.rollouts_per_example}): a group's rollouts are in flight together`,
        });
    }
    const sampledByTeacher = [c.distill, ...c.env.map((e) => e.distill)].some((d) => distills(d) && d.type === 'sft');
    if (sampledByTeacher && c.trainer.moe.router_replay)
      ctx.addIssue({
        code: 'custom',
        path: ['trainer', 'moe', 'router_replay'],
        message: "distill.type sft samples from the teacher: its tokens have no routes of the policy's to replay",
      });
    if (
      o.in_flight.enabled &&
      o.in_flight.max_rollouts !== undefined &&
      o.in_flight.max_rollouts < o.rollouts_per_example
    ) {
      ctx.addIssue({
        code: 'custom',
        path: ['orchestrator', 'in_flight', 'max_rollouts'],
        message: `${o.in_flight.max_rollouts} is below orchestrator.rollouts_per_example (${o.rollouts_per_example}): the cap must hold at least one group`,
      });
    }
    if (c.inference.replicas > 1 && c.inference.server.port === 0) {
      ctx.addIssue({
        code: 'custom',
        path: ['inference', 'server', 'port'],
        message: `port 0 (any free port) leaves inference.replicas (${c.inference.replicas}) no ports to follow: choose a port`,
      });
    }
    if (c.orchestrator.base_urls === undefined && c.inference.server.port === 0) {
      ctx.addIssue({
        code: 'custom',
        path: ['inference', 'server', 'port'],
        message:
          "port 0 (any free port) leaves the orchestrator no address for the run's inference server: choose a port, or set orchestrator.base_urls",
      });
    }
  })
  // Resolved here, so that --dry-run prints (and the workflow gets) the addresses and queues used.
  .transform((c) =>
    withRunQueue({
      ...c,
      orchestrator: {
        ...c.orchestrator,
        base_urls: c.orchestrator.base_urls ?? replicaServers(c.inference).map((server) => `${serverUrl(server)}/v1`),
      },
    }),
  );

export type RLConfig = z.output<typeof rlSchema>;
