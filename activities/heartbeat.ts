import { Context } from '@temporalio/activity';

/**
 * How often long activities heartbeat. Well under the smallest heartbeat timeout a run may set
 * (temporal.heartbeat_timeout_s >= 5), so a live worker is never mistaken for a dead one; the SDK
 * throttles what it actually sends to the server.
 */
export const HEARTBEAT_MS = 1_000;

/**
 * Runs `work` inside an activity, heartbeating `details()` until it settles. Compute runs off the
 * JS thread (native engine, env processes, HTTP), so the timer keeps firing while it works.
 */
export async function withHeartbeat<T>(details: () => unknown, work: () => Promise<T>): Promise<T> {
  const ctx = Context.current();
  const timer = setInterval(() => ctx.heartbeat(details()), HEARTBEAT_MS);
  try {
    return await work();
  } finally {
    clearInterval(timer);
  }
}
