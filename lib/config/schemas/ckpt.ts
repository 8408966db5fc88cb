/** [ckpt]: when checkpoints are written, how many are kept, and where a new start resumes. */
import { z } from 'zod';
import { positiveInt, section } from './common';

export const checkpointSchema = section({
  interval: positiveInt().default(50).describe('save a full checkpoint every N steps'),
  keep_last: positiveInt().optional().describe('keep only the newest N checkpoints; unset = keep all'),
  resume_step: z
    .number()
    .int()
    .nonnegative()
    .optional()
    .describe(
      'a new start continues from the checkpoint of this step, redoing (and first discarding) what came after it; unset = continue where the run is',
    ),
  skip_optimizer: z
    .boolean()
    .default(false)
    .describe(
      "with resume_step: take the checkpoint's weights but start AdamW afresh (its moments at zero), as if the training began there",
    ),
  skip_scheduler: z
    .boolean()
    .default(false)
    .describe(
      'with resume_step: the learning-rate schedule starts again at resume_step (its warmup included), over the steps left to max_steps',
    ),
}).superRefine((c, ctx) => {
  for (const k of ['skip_optimizer', 'skip_scheduler'] as const)
    if (c[k] && c.resume_step === undefined)
      ctx.addIssue({
        code: 'custom',
        path: [k],
        message: 'applies to the checkpoint a new start resumes from: set ckpt.resume_step',
      });
});
