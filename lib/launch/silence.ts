/**
 * The inference servers a run samples from, as the launcher's progress line watches them: a server
 * stopped (SIGSTOP), hung or cut off answers nothing, its requests in flight wait, and the run's
 * progress query still answers; the line then said nothing but a growing ETA. Each tick probes
 * every server's `/health` (any HTTP answer is life, a 401 too); one silent for `afterMs` is named.
 */
import { formatDuration } from '../run-ops/progress';

/** How long one probe may wait: a server that cannot answer `/health` in this is silent now. */
const PROBE_MS = 1500;

export class SilentServers {
  /** When each server last answered (from the start: a server starting up is not silent yet). */
  private readonly answered = new Map<string, number>();

  constructor(
    /** Server roots (`http://host:port`). */
    readonly roots: readonly string[],
    readonly afterMs = 10_000,
    now = Date.now(),
  ) {
    for (const r of roots) this.answered.set(r, now);
  }

  /** Probes every server once; each that answers (anything) counts as alive now. */
  async probe(): Promise<void> {
    await Promise.all(
      this.roots.map(async (root) => {
        try {
          await fetch(`${root}/health`, { signal: AbortSignal.timeout(PROBE_MS) }).then((r) => r.arrayBuffer());
          this.answered.set(root, Date.now());
        } catch {
          // Silent (or refusing connections): its time since the last answer grows.
        }
      }),
    );
  }

  /** What the progress line says of the servers silent for `afterMs`, if any. */
  note(now = Date.now()): string | undefined {
    const silent = this.roots
      .map((root) => ({ root, ms: now - this.answered.get(root)! }))
      .filter((s) => s.ms >= this.afterMs);
    if (silent.length === 0) return undefined;
    const list = silent.map((s) => `${s.root} for ${formatDuration(s.ms / 1000)}`).join(', ');
    return `inference server${silent.length > 1 ? 's' : ''} silent (stopped, hung or unreachable): ${list}`;
  }
}
