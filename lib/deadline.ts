/**
 * Deadlines and heartbeats: every wait ends, with a named outcome. A process that stops answering
 * (SIGSTOP, a livelock, a stuck syscall, a cut network link) never answers "no": it only stays
 * silent, so each wait on another process either has a deadline (`withDeadline`) or watches a
 * heartbeat (`Watchdog`): the launcher's children beat over their parent pipe
 * (lib/launch/supervise.ts), an inference server or teacher is probed on `/health` while requests
 * to it are in flight (lib/orchestrator/server-watch.ts), the Temporal dev server on its gRPC
 * health check. One setting says how long silence means dead: `temporal.heartbeat_timeout_s`, the
 * same span after which Temporal retries an activity whose worker sent no heartbeat.
 */

/** A wait that reached its deadline: `what` did not happen within `ms`. */
export class DeadlineError extends Error {
  override readonly name = 'DeadlineError';

  constructor(
    readonly what: string,
    readonly ms: number,
  ) {
    super(`${what}: nothing within ${formatMs(ms)}`);
  }
}

/** `1.5 s`, `250 ms`: a span in messages. */
export function formatMs(ms: number): string {
  return ms >= 1000 ? `${Number((ms / 1000).toFixed(1))} s` : `${Math.round(ms)} ms`;
}

/**
 * `work(signal)` bounded by `ms`: past it, `signal` aborts and the call rejects with a
 * `DeadlineError` naming `what`, whether or not `work` listens to the signal (a promise that never
 * settles is left behind, not waited on).
 */
export async function withDeadline<T>(what: string, ms: number, work: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const controller = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const e = new DeadlineError(what, ms);
      controller.abort(e);
      reject(e);
    }, ms);
  });
  try {
    return await Promise.race([work(controller.signal), expired]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Calls `onSilent` once when no `beat()` came for `ms`. The count starts at construction (or at
 * `beat()`); `stop()` ends the watch.
 *
 * A watchdog that was not running itself cannot tell: when its own check comes late by more than
 * half its deadline (this process was stopped, or its event loop blocked), it restarts the count
 * instead of judging, so a launcher resumed after a SIGSTOP does not kill every child whose beats
 * still wait unread in a pipe.
 */
export class Watchdog {
  private last = Date.now();
  private lastCheck = Date.now();
  private readonly timer: NodeJS.Timeout;
  private done = false;

  constructor(
    readonly ms: number,
    private readonly onSilent: (silentMs: number) => void,
  ) {
    const every = Math.max(50, Math.min(1000, ms / 4));
    this.timer = setInterval(() => this.check(every), every);
    this.timer.unref();
  }

  beat(): void {
    this.last = Date.now();
  }

  /** How long since the last beat (or the start). */
  get silentMs(): number {
    return Date.now() - this.last;
  }

  stop(): void {
    this.done = true;
    clearInterval(this.timer);
  }

  private check(every: number): void {
    const now = Date.now();
    const late = now - this.lastCheck - every;
    this.lastCheck = now;
    if (late > this.ms / 2) {
      this.last = now;
      return;
    }
    if (this.done || now - this.last < this.ms) return;
    this.stop();
    this.onSilent(now - this.last);
  }
}
