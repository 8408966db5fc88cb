/**
 * [concurrency]: how many rollouts are in flight at once, adapted to the inference servers' load
 * (lib/orchestrator/concurrency.ts) within [min_inflight, max_inflight]. The orchestrator's
 * (`[orchestrator.concurrency]`), an eval's (`[eval.concurrency]`, the `eval` command's
 * `[concurrency]`).
 */
import { z } from 'zod';
import { positiveInt } from './common';

export const concurrencySchema = z
  .strictObject({
    initial_inflight: positiveInt()
      .optional()
      .describe(
        "rollouts in flight at the start; unset = the servers' KV cache in tokens over seq_len (read from their /metrics), at least min_inflight",
      ),
    min_inflight: positiveInt()
      .default(1)
      .describe('fewest rollouts in flight (min_inflight = max_inflight: a fixed concurrency)'),
    max_inflight: positiveInt()
      .default(1024)
      .describe(
        'most rollouts in flight; between the bounds the number grows while the servers have KV room and shrinks when they preempt or queue',
      ),
  })
  .superRefine((c, ctx) => {
    if (c.min_inflight > c.max_inflight)
      ctx.addIssue({
        code: 'custom',
        path: ['min_inflight'],
        message: `${c.min_inflight} is above max_inflight (${c.max_inflight}): the bounds hold the number of rollouts in flight, min_inflight <= max_inflight`,
      });
    if (
      c.initial_inflight !== undefined &&
      (c.initial_inflight < c.min_inflight || c.initial_inflight > c.max_inflight)
    )
      ctx.addIssue({
        code: 'custom',
        path: ['initial_inflight'],
        message: `${c.initial_inflight} is outside [min_inflight, max_inflight] = [${c.min_inflight}, ${c.max_inflight}]`,
      });
  })
  .prefault({});

export type ConcurrencyConfig = z.output<typeof concurrencySchema>;
