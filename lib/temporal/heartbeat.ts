/**
 * Heartbeats of long activities, shared by the activities of every pool (called inside an activity:
 * it reads the activity's Context).
 */
import { Context } from '@temporalio/activity';
import { runInThread } from '../thread';

/**
 * How often long activities heartbeat. Well under the smallest heartbeat timeout a run may set
 * (temporal.heartbeat_timeout_s >= 5), so a live worker is never mistaken for a dead one; the SDK
 * throttles what it actually sends to the server.
 */
export const HEARTBEAT_MS = 1_000;

/**
 * Runs `work` inside an activity, heartbeating `details()` until it settles. Compute must run off
 * the JS thread (native engine, env processes, HTTP, lib/thread.ts), so the timer keeps firing
 * while it works. `work` may also call `beat` to heartbeat at once (on progress it observes).
 */
export async function withHeartbeat<T>(details: () => unknown, work: (beat: () => void) => Promise<T>): Promise<T> {
  const ctx = Context.current();
  const beat = () => ctx.heartbeat(details());
  const timer = setInterval(beat, HEARTBEAT_MS);
  try {
    return await work(beat);
  } finally {
    clearInterval(timer);
  }
}

/**
 * `runInThread` (lib/thread.ts) inside an activity: CPU-bound work off this thread, heartbeating
 * on the timer and at each progress value the thread posts (the latest one is the details).
 */
export function inThreadWithHeartbeat<O>(module: string, fn: string, input: unknown, initial: unknown): Promise<O> {
  let progress = initial;
  return withHeartbeat(
    () => progress,
    (beat) =>
      runInThread<O>(module, fn, input, (p) => {
        progress = p;
        beat();
      }),
  );
}
