/**
 * lib/ raises failures that no retry fixes as `NonRetryableError` (it knows no Temporal); an
 * activity must raise them as Temporal's non-retryable `ApplicationFailure` of the same type (and
 * a full disk as a retryable one of type `DiskFull`).
 * `withFailureTypes` does it for the activities a worker registers (activities/index.ts).
 */
import { ApplicationFailure } from '@temporalio/common';
import { DISK_FULL } from '../lib/atomic';
import { NonRetryableError } from '../lib/failures';

/**
 * `e` as an activity raises it: a lib `NonRetryableError` becomes a non-retryable failure of its
 * type; a full disk (`DiskFullError`, or one that crossed a thread by name) a retryable failure of
 * type `DiskFull`, which the launcher's progress line reads as "waiting for disk space".
 */
export function asActivityFailure(e: unknown): unknown {
  if (e instanceof NonRetryableError) return ApplicationFailure.nonRetryable(e.message, e.type);
  if (e instanceof Error && e.name === DISK_FULL) return ApplicationFailure.retryable(e.message, DISK_FULL);
  return e;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- any activity signature
type Activities = Record<string, (...args: any[]) => Promise<unknown>>;

/** `activities` with each one's lib `NonRetryableError` raised as a non-retryable failure. */
export function withFailureTypes<A extends Activities>(activities: A): A {
  const wrapped: Activities = {};
  for (const [name, fn] of Object.entries(activities)) {
    wrapped[name] = async (...args) => {
      try {
        return await fn(...args);
      } catch (e) {
        throw asActivityFailure(e);
      }
    };
  }
  return wrapped as A;
}
