/**
 * [weight_broadcast] (rl): how a new policy reaches the inference servers, in prime-rl's spelling.
 * `filesystem` (the default): the trainer writes `weights/step_n` and each server reads it.
 * `nccl`: trainer rank 0 also sends each version to the servers over a c10d process group it forms
 * with them (NCCL between CUDA devices where the build has it, Gloo otherwise), and a server loads
 * what it received instead of reading the folder; the folder is still written, the fallback for a
 * server that joins late or a group that breaks (lib/trainer/broadcast.ts).
 */
import { z } from 'zod';
import { positiveInt, section } from './common';

export const WEIGHT_BROADCASTS = ['filesystem', 'nccl'] as const;

export const weightBroadcastSchema = section({
  type: z
    .enum(WEIGHT_BROADCASTS)
    .default('filesystem')
    .describe(
      "filesystem: servers read each version's folder; nccl: trainer rank 0 sends it to them over a c10d group (NCCL on GPUs, Gloo on CPUs), the folder staying the fallback",
    ),
  host: z
    .string()
    .min(1)
    .default('127.0.0.1')
    .describe("nccl: trainer rank 0's address, where it serves the group's store; the servers connect to it"),
  port: z
    .number()
    .int()
    .min(0)
    .max(65535)
    .default(29501)
    .describe("nccl: the group's store port (0: any free port, for servers on this host)"),
  timeout_s: positiveInt()
    .default(1200)
    .describe(
      'nccl: a server silent this long while the group forms or a version moves is dropped; the folder serves it',
    ),
  bucket_mb: z.number().positive().default(256).describe('nccl: the bytes of one collective, in MiB'),
});

export type WeightBroadcastConfig = z.output<typeof weightBroadcastSchema>;
