/** [wandb]: Weights & Biases logging of an RL run. */
import { z } from 'zod';

/**
 * Present (a [wandb] table, any --wandb.* flag or PRIME_WANDB__* variable) = W&B logging on, as
 * in prime-rl; absent = off. Only rl runs log to W&B, from a cpu worker (activities/wandb.ts).
 */
export const wandbSchema = z
  .strictObject({
    project: z
      .string()
      .min(1)
      .default('prime-rl')
      .describe(
        "Weights & Biases project. A [wandb] table (even empty) or any --wandb.* flag logs every step's metrics to W&B (needs WANDB_API_KEY, or WANDB_MODE=offline for a local run folder); no [wandb] = no W&B",
      ),
    name: z.string().min(1).optional().describe('W&B run name; unset = run_name'),
    entity: z.string().min(1).optional().describe("W&B team or user; unset = the API key's default"),
  })
  .optional();
