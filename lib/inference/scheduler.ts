/**
 * Continuous batching over the native generator. Requests wait in a FIFO queue; between decode
 * steps the loop applies a pending weight update, drops cancelled sequences, admits waiting
 * requests while slots and KV-cache budget allow (prefill), then decodes one token for every
 * running sequence in one batched step and hands each token to its request.
 *
 * A sequence reserves `prompt + max_tokens` cache tokens when admitted, so an admitted request
 * never runs out of cache mid-way; the budget is `kv_cache_tokens`. The sequences of one HTTP
 * request are submitted together (`submitAll`): all of them are queued, or none is.
 */
import type { GenerationRequest, Generator, NativeModel, TopLogprobs, WeightTensor } from '../../native';

/** 'error': the engine could not continue the sequence; see `SequenceError`. */
export type FinishReason = 'stop' | 'length' | 'abort' | 'error';

/** Why the engine failed a sequence: non-finite logits (broken weights), or a failed prefill. */
export interface SequenceError {
  code: 'non_finite_logits' | 'prefill_failed' | 'kv_cache_exceeded';
  message: string;
}

export interface SequenceCallbacks {
  /** A sampled token (with its top alternatives when asked). Return true to stop the sequence here (a stop string matched). */
  onToken(
    token: number,
    logprob: number,
    policyVersion: number,
    top?: TopLogprobs,
    routes?: Int32Array,
  ): boolean | void;
  /** The sequence ended: 'stop' (stop token or stop string), 'length', 'abort' (cancelled, shutdown) or 'error' (with a message). */
  onFinish(reason: FinishReason, policyVersion: number, error?: SequenceError): void;
  /** Prefill is done; prompt logprobs and (MoE) prompt routes when they were asked for. */
  onAdmitted?(promptLogprobs?: Float32Array, promptRoutes?: Int32Array): void;
}

export interface SequenceHandle {
  /** Stops the sequence and frees its cache (client gone). Idempotent. */
  cancel(): void;
}

export interface SchedulerOptions {
  maxRunning: number;
  maxQueued: number;
  kvCacheTokens: number;
}

interface Entry {
  request: GenerationRequest & { maxTokens: number };
  callbacks: SequenceCallbacks;
  reserved: number;
  seqId?: number;
  cancelled: boolean;
  done: boolean;
}

/** The queue has no room now (429: retry later). */
export class QueueFullError extends Error {}
export class ShuttingDownError extends Error {}
/** A request no state of this server could ever run (a configured limit, named by `limit`): retrying cannot help. */
export class LimitError extends Error {
  constructor(
    message: string,
    readonly limit: 'kv_cache_tokens' | 'max_queued',
  ) {
    super(message);
  }
}

export interface PolicyInfo {
  version: number;
  weightDir: string;
}

export class Scheduler {
  private readonly waiting: Entry[] = [];
  private readonly running = new Map<number, Entry>();
  private reservedTokens = 0;
  /** Taken from `waiting`, prefill in progress (not yet in `running`). */
  private admitting = 0;
  private loop: Promise<void> | undefined;
  private pendingWeights: { tensors: readonly WeightTensor[]; policy: PolicyInfo; done: (e?: Error) => void }[] = [];
  /** Calls waiting for a moment with no engine call in flight (`betweenSteps`). */
  private pendingCalls: (() => void)[] = [];
  private closing = false;
  policy: PolicyInfo;
  /** Tokens sampled since start (for metrics). */
  generatedTokens = 0;
  promptTokens = 0;

  constructor(
    private readonly model: NativeModel,
    private readonly generator: Generator,
    private readonly opts: SchedulerOptions,
    initialPolicy: PolicyInfo,
  ) {
    this.policy = initialPolicy;
  }

  get runningCount(): number {
    return this.running.size;
  }
  get waitingCount(): number {
    return this.waiting.length;
  }
  get cacheUsage(): number {
    return this.generator.stats().cacheUsage;
  }

  /** Queues one sequence; see `submitAll`. */
  submit(request: GenerationRequest & { maxTokens: number }, callbacks: SequenceCallbacks): SequenceHandle {
    return this.submitAll([{ request, callbacks }])[0];
  }

  /**
   * Queues the sequences of one request, all or none: throws ShuttingDownError, LimitError (the
   * request can never run here) or QueueFullError (no room now) before queueing any, so work that
   * was refused never runs.
   */
  submitAll(
    items: readonly { request: GenerationRequest & { maxTokens: number }; callbacks: SequenceCallbacks }[],
  ): SequenceHandle[] {
    if (this.closing) throw new ShuttingDownError('server is shutting down');
    for (const { request } of items) {
      const reserved = request.promptIds.length + request.maxTokens;
      if (reserved > this.opts.kvCacheTokens) {
        throw new LimitError(
          `prompt ${request.promptIds.length} + max_tokens ${request.maxTokens} = ${reserved} tokens exceed this server's KV-cache budget (kv_cache_tokens ${this.opts.kvCacheTokens})`,
          'kv_cache_tokens',
        );
      }
    }
    const k = items.length;
    if (k > this.opts.maxQueued + this.opts.maxRunning) {
      throw new LimitError(
        `${k} sequences in one request (prompts x n) can never be queued: at most max_queued ${this.opts.maxQueued} + max_running ${this.opts.maxRunning} = ${this.opts.maxQueued + this.opts.maxRunning} fit`,
        'max_queued',
      );
    }
    // Sequences that will get a free slot at the next step are not waiting for one.
    const freeSlots = Math.max(0, this.opts.maxRunning - this.running.size - this.admitting);
    if (this.waiting.length + k > this.opts.maxQueued + freeSlots) {
      throw new QueueFullError(
        `too many queued sequences (max_queued ${this.opts.maxQueued}; this request has ${k}, ${this.waiting.length} wait): retry later`,
      );
    }
    const entries = items.map(({ request, callbacks }): Entry => ({
      request,
      callbacks,
      reserved: request.promptIds.length + request.maxTokens,
      cancelled: false,
      done: false,
    }));
    this.waiting.push(...entries);
    this.kick();
    return entries.map((entry) => ({
      cancel: () => {
        if (entry.done || entry.cancelled) return;
        entry.cancelled = true;
        this.kick();
      },
    }));
  }

  /** Loads new weights between two decode steps; resolves once they serve. */
  updateWeights(tensors: readonly WeightTensor[], policy: PolicyInfo): Promise<void> {
    return new Promise((resolve, reject) => {
      this.pendingWeights.push({ tensors, policy, done: (e) => (e ? reject(e) : resolve()) });
      this.kick();
    });
  }

  /**
   * Runs `fn` while no engine call is in flight: at once when the engine is idle, else before its
   * next step. A fork of this process must wait for it: OpenBLAS's fork handlers stop its threads,
   * which deadlocks a matmul running on them.
   */
  betweenSteps(fn: () => void): Promise<void> {
    if (!this.loop) {
      fn();
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      this.pendingCalls.push(() => {
        try {
          fn();
          resolve();
        } catch (e) {
          reject(e as Error);
        }
      });
    });
  }

  /** Stops admitting; running and queued sequences finish (or are aborted after `graceMs`). */
  async shutdown(graceMs: number): Promise<void> {
    this.closing = true;
    const timer = setTimeout(() => {
      for (const e of [...this.waiting, ...this.running.values()]) e.cancelled = true;
      this.kick();
    }, graceMs);
    while (this.loop) await this.loop;
    clearTimeout(timer);
  }

  private kick(): void {
    if (this.loop) return;
    this.loop = this.run().finally(() => {
      this.loop = undefined;
      if (this.hasWork()) this.kick();
    });
  }

  private hasWork(): boolean {
    return (
      this.pendingCalls.length > 0 || this.pendingWeights.length > 0 || this.waiting.length > 0 || this.running.size > 0
    );
  }

  private finish(entry: Entry, reason: FinishReason, error?: SequenceError): void {
    if (entry.done) return;
    entry.done = true;
    if (entry.seqId !== undefined) {
      this.running.delete(entry.seqId);
      this.reservedTokens -= entry.reserved;
    }
    entry.callbacks.onFinish(reason, this.policy.version, error);
  }

  private async run(): Promise<void> {
    while (this.hasWork()) {
      for (const call of this.pendingCalls.splice(0)) call();
      // 1. weight updates take effect between steps
      while (this.pendingWeights.length > 0) {
        const update = this.pendingWeights.shift()!;
        try {
          await this.model.loadWeights(update.tensors);
          this.policy = update.policy;
          update.done();
        } catch (e) {
          update.done(e as Error);
        }
      }
      // 2. cancelled sequences leave and free their cache
      const gone = [...this.running.values()].filter((e) => e.cancelled);
      if (gone.length > 0) {
        await this.generator.remove(gone.map((e) => e.seqId!));
        for (const e of gone) this.finish(e, 'abort');
      }
      for (let i = this.waiting.length - 1; i >= 0; i--) {
        if (this.waiting[i].cancelled) this.finish(this.waiting.splice(i, 1)[0], 'abort');
      }
      // 3. admit waiting requests while slots and cache budget allow
      const admitted: Entry[] = [];
      while (
        this.waiting.length > 0 &&
        this.running.size + admitted.length < this.opts.maxRunning &&
        this.reservedTokens + this.waiting[0].reserved <= this.opts.kvCacheTokens
      ) {
        const e = this.waiting.shift()!;
        this.reservedTokens += e.reserved;
        admitted.push(e);
      }
      if (admitted.length > 0) {
        this.admitting = admitted.length;
        try {
          const added = await this.generator.add(admitted.map((e) => e.request));
          added.forEach((a, i) => {
            const e = admitted[i];
            e.seqId = a.seqId;
            this.running.set(a.seqId, e);
            this.promptTokens += e.request.promptIds.length;
            e.callbacks.onAdmitted?.(a.promptLogprobs, a.promptRoutes);
          });
        } catch (err) {
          // Requests are validated before they get here; a failure now is the engine's. Fail them, keep serving.
          for (const e of admitted) {
            this.reservedTokens -= e.reserved;
            this.finish(e, 'error', { code: 'prefill_failed', message: `prefill failed: ${(err as Error).message}` });
          }
          process.stderr.write(`inference: prefill failed: ${(err as Error).message}\n`);
        } finally {
          this.admitting = 0;
        }
      }
      if (this.running.size === 0) {
        if (admitted.length === 0 && this.waiting.length > 0) {
          // Nothing runs, yet the head does not fit the whole budget: it never will. submitAll
          // refuses such requests; were one to get here, failing it beats spinning on it forever.
          const e = this.waiting.shift()!;
          this.finish(e, 'error', {
            code: 'kv_cache_exceeded',
            message: `prompt + max_tokens = ${e.reserved} tokens exceed the KV-cache budget (kv_cache_tokens ${this.opts.kvCacheTokens})`,
          });
        }
        // Nothing to decode: let the event loop run (HTTP, signals) before looking again.
        await new Promise<void>((resolve) => setImmediate(resolve));
        continue;
      }
      // 4. one decode step for every running sequence
      const tokens = await this.generator.step();
      const stopNow: Entry[] = [];
      for (const t of tokens) {
        const e = this.running.get(t.seqId);
        if (!e) continue;
        if (t.finishReason === 'error') {
          // No token: the engine dropped the sequence (its only reason: non-finite logits). The others go on.
          this.finish(e, 'error', {
            code: 'non_finite_logits',
            message: t.error ?? 'the model produced non-finite logits',
          });
          continue;
        }
        this.generatedTokens += 1;
        const stop = e.cancelled
          ? false
          : e.callbacks.onToken(t.token, t.logprob, this.policy.version, t.topLogprobs, t.routes);
        if (t.finished) this.finish(e, t.finishReason ?? 'length');
        else if (stop) stopNow.push(e);
      }
      if (stopNow.length > 0) {
        await this.generator.remove(stopNow.map((e) => e.seqId!));
        for (const e of stopNow) this.finish(e, 'stop');
      }
    }
  }
}
