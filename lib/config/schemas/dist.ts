/** trainer.world_size and trainer.dist: the data-parallel trainer ranks and how they rendezvous. */
import { z } from 'zod';
import { DIST_BACKENDS, SHARDINGS } from '../../../native/engine-types.generated';
import { positiveInt, section } from './common';

/** What data-parallel trainer ranks shard (native/src/trainer.h `Sharding`). */
export { SHARDINGS };
export const SHARDING_HELP =
  "what the ranks shard: 'optimizer' = AdamW's state (ZeRO-1; each rank holds the whole model and its gradients), 'full' = parameters, gradients and AdamW state alike (FSDP)";

/**
 * The data-parallel trainer (lib/trainer/group.ts): `world_size` ranks, one process each, rank 0
 * the Temporal worker serving the c10d TCP store at `dist.host:dist.port` that the other ranks
 * rendezvous through. Shared by `rl` (trainer.*), `sft` (trainer.*) and `worker` (trainer.*, with
 * the rank).
 */
export const trainerScaleShape = {
  world_size: positiveInt()
    .default(1)
    .describe('trainer ranks (processes) that train each step together, data parallel; rl and sft start them all'),
  dist: section({
    host: z
      .string()
      .min(1)
      .default('127.0.0.1')
      .describe("rank 0's address: it serves the c10d TCP store there, the other ranks connect to it"),
    port: z
      .number()
      .int()
      .min(0)
      .max(65535)
      .default(0)
      .describe('TCP store port; 0 = rl and sft pick a free one for their local ranks (a worker needs a real port)'),
    token_var: z
      .string()
      .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'an environment variable name')
      .default('TRAINER_DIST_TOKEN')
      .describe(
        'environment variable holding the shared secret of the ranks: rank 0 signs every group and job it hands out through the store with it, the others act on nothing else; rl and sft give their local ranks a fresh one, ranks started by hand need the same value each',
      ),
    timeout_s: z
      .number()
      .positive()
      .default(60)
      .describe('a rank silent this long (joining, a collective) fails the step, which is retried on a fresh group'),
    bucket_mb: z.number().positive().default(25).describe('gradient all-reduce bucket size in MiB'),
    sharding: z.enum(SHARDINGS).default('optimizer').describe(SHARDING_HELP),
    backend: z
      .enum(DIST_BACKENDS)
      .default('auto')
      .describe(
        'what moves CUDA tensors between ranks: auto = NCCL where the native addon has it (PyTorch 2.x with CUDA), else Gloo; CPU tensors always go over Gloo',
      ),
  }),
};

/** `trainer` of `worker`: which rank this process is. */
export const trainerRankSchema = section({
  ...trainerScaleShape,
  rank: z
    .number()
    .int()
    .nonnegative()
    .default(0)
    .describe('this trainer rank: 0 polls the trainer task queue and drives ranks 1..world_size-1'),
}).superRefine((t, ctx) => {
  if (t.rank >= t.world_size)
    ctx.addIssue({
      code: 'custom',
      path: ['rank'],
      message: `must be below trainer.world_size (${t.world_size}): ranks are 0..${t.world_size - 1}`,
    });
  if (t.world_size > 1 && t.dist.port === 0)
    ctx.addIssue({
      code: 'custom',
      path: ['dist', 'port'],
      message: 'every rank must know the TCP store port of rank 0: set the same trainer.dist.port on all ranks',
    });
});
export type TrainerRankConfig = z.output<typeof trainerRankSchema>;
