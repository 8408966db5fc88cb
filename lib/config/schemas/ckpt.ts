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
});
