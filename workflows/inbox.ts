/**
 * Completions of a workflow's work in flight, taken one at a time in the order Temporal resolved
 * them: the one way a workflow with concurrent branches keeps the order of its commands independent
 * of how the SDK groups completions into activations.
 *
 * Why it is needed: when two activities complete within one workflow task, a worker may see them in
 * one activation or in two (ARCHITECTURE.md has the chaos run that showed it). In one activation, plain `await`s in two branches resume in the order of their promise chains'
 * depths, not of the completions, so a branch with one more `.then` issues its next command second;
 * in two activations it issues it first. The replay then meets the commands in another order than
 * the history recorded: a nondeterminism error, and a run stuck retrying its workflow task.
 *
 * Here each piece of work's promise gets its callback when it is added, one hop from the SDK's own
 * promise for every activity alike, so the callbacks run in resolution order however the
 * completions were grouped, and each appends its completion to a FIFO. The workflow takes them with
 * `next()` and issues every command from that one place. Child workflows take more hops than
 * activities: a workflow should run one only when nothing else is in flight.
 */
export class Inbox<T> {
  private readonly arrived: ({ ok: true; value: T } | { ok: false; error: unknown })[] = [];
  private inFlight = 0;
  private wake?: () => void;

  /** Work whose completion (or failure) `next()` hands back in its turn. */
  add(work: Promise<T>): void {
    this.inFlight++;
    work.then(
      (value) => this.arrive({ ok: true, value }),
      (error: unknown) => this.arrive({ ok: false, error }),
    );
  }

  /** Work added and not yet taken by `next()`. */
  get size(): number {
    return this.inFlight;
  }

  /** The next completion in resolution order; a failure is thrown here. Needs `size > 0`. */
  async next(): Promise<T> {
    if (this.inFlight === 0) throw new Error('Inbox.next() with no work in flight');
    while (this.arrived.length === 0) await new Promise<void>((resolve) => (this.wake = resolve));
    this.inFlight--;
    const first = this.arrived.shift()!;
    if (!first.ok) throw first.error;
    return first.value;
  }

  private arrive(entry: { ok: true; value: T } | { ok: false; error: unknown }): void {
    this.arrived.push(entry);
    this.wake?.();
    this.wake = undefined;
  }
}
