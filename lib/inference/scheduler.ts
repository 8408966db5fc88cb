/**
 * Continuous batching over the native generator. Requests wait in a FIFO queue; between engine
 * steps the loop applies a pending weight update, drops cancelled sequences, hands the engine the
 * head of the queue (it admits as many as its paged KV cache has blocks for: the engine's block
 * accounting is the one source of truth), then runs one step (a decode row for every running
 * sequence, prefill chunks of the new ones) and hands each token to its request.
 *
 * A sequence takes cache blocks as it grows; when they run out the engine preempts one and
 * recomputes it later, which the requests do not see (same tokens). The sequences of one HTTP
 * request are submitted together (`submitAll`): all of them are queued, or none is.
 */
import type { CacheStats, GenerationRequest, Generator, NativeModel, TopLogprobs, WeightTensor } from '../../native';

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
  /** `inference.kv_cache_tokens` as configured (for messages; the engine's capacity is the limit). */
  kvCacheTokens?: number;
  /** Decode steps per engine call while nothing waits (`inference.decode_steps`). */
  decodeSteps?: number;
}

interface Entry {
  request: GenerationRequest & { maxTokens: number };
  callbacks: SequenceCallbacks;
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
  /** Handed to the engine (running there, or preempted and waiting to be recomputed). */
  private readonly running = new Map<number, Entry>();
  /** Offered to the engine in the call now running (not yet in `running`). */
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
  /** The engine's cache: blocks in use, preemptions, prefix hits (metrics). */
  get cache(): CacheStats {
    return this.generator.stats();
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
    const { capacityTokens, blockSize } = this.generator.stats();
    for (const { request } of items) {
      const tokens = request.promptIds.length + request.maxTokens;
      if (tokens > capacityTokens) {
        const setting = this.opts.kvCacheTokens === undefined ? '' : `kv_cache_tokens ${this.opts.kvCacheTokens}, `;
        throw new LimitError(
          `prompt ${request.promptIds.length} + max_tokens ${request.maxTokens} = ${tokens} tokens exceed this server's KV cache (${setting}${capacityTokens} positions in blocks of ${blockSize})`,
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
    if (entry.seqId !== undefined) this.running.delete(entry.seqId);
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
      // 3. the engine admits the head of the queue as far as it has slots and blocks
      let admitted = 0;
      const room = this.opts.maxRunning - this.running.size;
      if (this.waiting.length > 0 && room > 0) {
        const offered = this.waiting.slice(0, room);
        this.admitting = offered.length;
        try {
          const added = await this.generator.add(offered.map((e) => e.request));
          this.waiting.splice(0, added.length);
          added.forEach((a, i) => {
            const e = offered[i];
            e.seqId = a.seqId;
            this.running.set(a.seqId, e);
            this.promptTokens += e.request.promptIds.length;
          });
          admitted = added.length;
        } catch (err) {
          // Requests are validated before they get here; a failure now is the engine's. Fail them, keep serving.
          this.waiting.splice(0, offered.length); // the head (submitAll only appends meanwhile)
          for (const e of offered) {
            this.finish(e, 'error', { code: 'prefill_failed', message: `prefill failed: ${(err as Error).message}` });
          }
          process.stderr.write(`inference: admission failed: ${(err as Error).message}\n`);
        } finally {
          this.admitting = 0;
        }
      }
      if (this.running.size === 0) {
        if (admitted === 0 && this.waiting.length > 0) {
          // Nothing runs, yet the engine takes not even the head: it never will. submitAll
          // refuses such requests; were one to get here, failing it beats spinning on it forever.
          const e = this.waiting.shift()!;
          this.finish(e, 'error', {
            code: 'kv_cache_exceeded',
            message: `prompt + max_tokens = ${e.request.promptIds.length + e.request.maxTokens} tokens do not fit the KV cache (${this.generator.stats().capacityTokens} positions)`,
          });
        }
        // Nothing to decode: let the event loop run (HTTP, signals) before looking again.
        await new Promise<void>((resolve) => setImmediate(resolve));
        continue;
      }
      // 4. one engine step (several decode steps while nothing waits)
      const tokens = await this.generator.step(this.waiting.length === 0 ? (this.opts.decodeSteps ?? 1) : 1);
      const stopNow = new Set<Entry>();
      for (const t of tokens) {
        const e = this.running.get(t.seqId);
        if (!e || stopNow.has(e)) continue; // (tokens a multi-step call computed past a stop string)
        if (t.first) e.callbacks.onAdmitted?.(t.promptLogprobs, t.promptRoutes);
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
        else if (stop) stopNow.add(e);
      }
      if (stopNow.size > 0) {
        await this.generator.remove([...stopNow].map((e) => e.seqId!));
        for (const e of stopNow) this.finish(e, 'stop');
      }
    }
  }
}
