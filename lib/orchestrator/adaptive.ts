/**
 * A list of rollouts played with the number in flight set by a ConcurrencyController (an eval's
 * rollouts; lib/orchestrator/concurrency.ts): new ones start while fewer than its limit are in
 * flight, the servers are read every `intervalMs` beside them (a slow `/metrics` never holds up a
 * rollout), and each finished rollout is reported to the controller.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { ConcurrencyController, EngineReading } from './concurrency';

/** How often the servers' counters are read. */
export const LOAD_INTERVAL_MS = 500;

export interface AdaptiveOptions<T> {
  controller: ConcurrencyController;
  /** The servers' counters now (undefined: no signal). */
  read(): Promise<EngineReading[] | undefined>;
  intervalMs?: number;
  /** Rollouts an item plays (a group's); default 1. */
  weight?(item: T): number;
  /**
   * Whether finishing an item reports its rollouts to the controller (default); false when the
   * caller reports each rollout as it finishes (a group's finish one by one).
   */
  reportFinished?: boolean;
}

/**
 * `fn` of every item, in item order; their rollouts at most the controller's limit at once (an
 * item at least, whatever its weight).
 */
export async function mapAdaptive<T, R>(
  items: readonly T[],
  fn: (item: T) => Promise<R>,
  { controller, read, intervalMs = LOAD_INTERVAL_MS, weight = () => 1, reportFinished = true }: AdaptiveOptions<T>,
): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  let running = 0;
  let failure: { e: unknown } | undefined;
  let wake: (() => void) | undefined;
  const woken = () => new Promise<void>((resolve) => (wake = resolve));
  let reading = false;
  let nextReading = 0;
  const observe = () => {
    reading = true;
    void read()
      .then((r) => controller.observe(r, running))
      .catch(() => controller.observe(undefined, running))
      .finally(() => {
        reading = false;
        nextReading = Date.now() + intervalMs;
        wake?.(); // the limit may have moved
      });
  };
  while ((next < items.length || running > 0) && failure === undefined) {
    if (!reading && Date.now() >= nextReading) observe();
    if (next < items.length && (running === 0 || running + weight(items[next]) <= controller.limit)) {
      const i = next++;
      const w = weight(items[i]);
      running += w;
      void fn(items[i])
        .then((r) => (out[i] = r))
        .catch((e: unknown) => (failure ??= { e }))
        .finally(() => {
          running -= w;
          if (reportFinished) for (let k = w; k > 0; k--) controller.finished(running + k - 1);
          wake?.();
        });
      continue;
    }
    // Until a rollout finishes or the next reading is due.
    await Promise.race([woken(), sleep(Math.max(10, nextReading - Date.now()))]);
  }
  if (failure) throw failure.e;
  return out;
}
