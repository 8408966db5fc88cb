/**
 * The liveness of an HTTP server while requests to it are in flight (the inference servers, a
 * distillation teacher). A request may rightly take minutes (a long generation), so its own
 * deadline says nothing early about a server that stopped answering altogether: stopped
 * (SIGSTOP), its event loop blocked, or cut off by the network. Its TCP connections stay open (the
 * kernel accepts new ones for a stopped process), and nothing ever comes. So while requests are in
 * flight, a server that has answered nothing for a second is probed on `/health`; silent for
 * `deadlineMs`, its requests in flight are aborted with a `SilentServerError` (the caller treats
 * the server as unavailable: sets it aside, moves the requests). Any HTTP answer counts as life
 * (a 404 from a server without `/health` too): the question is only whether it answers at all.
 */
import { formatMs, Watchdog } from '../deadline';

/** A server that answered nothing, requests nor probes, for the deadline. */
export class SilentServerError extends Error {
  override readonly name = 'SilentServerError';

  constructor(root: string, silentMs: number) {
    super(
      `${root} answered nothing for ${formatMs(silentMs)}, not even /health (stopped, hung, or cut off by the network)`,
    );
  }
}

export class ServerWatch {
  private inFlight = 0;
  private controller = new AbortController();
  private dog?: Watchdog;
  private prober?: NodeJS.Timeout;
  private probing = false;

  constructor(
    /** The server root (`http://host:port`): its `/health` is probed. */
    readonly root: string,
    readonly deadlineMs: number,
    private readonly headers: () => Record<string, string> = () => ({}),
  ) {}

  /**
   * `request(signal)` while the server is watched: `signal` aborts (with a `SilentServerError`)
   * once the server is found silent. The request calls `answered()` when a response arrives.
   */
  async run<T>(request: (signal: AbortSignal) => Promise<T>): Promise<T> {
    if (this.inFlight++ === 0) this.start();
    try {
      return await request(this.controller.signal);
    } finally {
      if (--this.inFlight === 0) this.end();
    }
  }

  /** The server answered (any status): it lives. */
  answered(): void {
    this.dog?.beat();
  }

  private start(): void {
    const dog = new Watchdog(this.deadlineMs, (silentMs) => {
      this.end();
      const silenced = this.controller;
      this.controller = new AbortController();
      // The requests settle (rejecting) after this; until they have, the server is watched afresh.
      this.start();
      silenced.abort(new SilentServerError(this.root, silentMs));
    });
    const every = Math.max(50, Math.min(1000, this.deadlineMs / 4));
    const prober = setInterval(() => {
      if (this.probing || dog.silentMs < every) return;
      this.probing = true;
      fetch(`${this.root}/health`, { headers: this.headers(), signal: AbortSignal.timeout(this.deadlineMs) })
        .then(async (res) => {
          dog.beat();
          await res.body?.cancel();
        })
        .catch(() => undefined)
        .finally(() => (this.probing = false));
    }, every);
    prober.unref();
    this.dog = dog;
    this.prober = prober;
  }

  private end(): void {
    this.dog?.stop();
    clearInterval(this.prober);
    this.dog = undefined;
    this.prober = undefined;
  }
}
