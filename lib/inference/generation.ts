/**
 * The sequences of one HTTP request, as the routes need them: tokens and their logprobs, text
 * decoded as it grows, OpenAI `stop` strings (the text is cut before the match), and streaming of
 * text deltas that can no longer turn into a stop string.
 *
 * All sequences of a request are queued together or not at all (`startSequences` throws before
 * anything runs), share one abort listener, and fail together: when the engine fails one of them
 * (non-finite logits), the others are cancelled and the request rejects with an EngineError.
 */
import type { GenerationRequest, TopLogprobs } from '../../native';
import { IncrementalDetokenizer, type Tokenizer } from '../model/tokenizer';
import type { FinishReason, Scheduler, SequenceCallbacks, SequenceError, SequenceHandle } from './scheduler';

export type { FinishReason } from './scheduler';

export interface SequenceResult {
  tokenIds: number[];
  logprobs: number[];
  /** Per token, when the request asked for top logprobs. */
  topLogprobs: TopLogprobs[];
  text: string;
  finishReason: Exclude<FinishReason, 'error'>;
  /** The version served when the sequence finished. */
  policyVersion: number;
  /** Per token, the policy version that sampled it: weights can change between two decode steps. */
  tokenPolicyVersions: number[];
  /**
   * The oldest and newest version that sampled a token (`policyVersion` twice when there is none):
   * different when a weight update landed while the sequence ran.
   */
  policyVersionRange: [number, number];
  promptLogprobs?: Float32Array;
  /** MoE, when asked: per prompt token but the last, and per token, the experts it was routed to. */
  promptRoutes?: Int32Array;
  routes: Int32Array[];
}

/** The engine could not generate a sequence of the request (e.g. the weights give NaN logits). */
export class EngineError extends Error {
  constructor(
    readonly code: SequenceError['code'],
    message: string,
  ) {
    super(message);
  }
}

export interface SequenceOptions {
  /** Decode text (routes that return text); /v1/generate returns tokens only. */
  tokenizer?: Tokenizer;
  stopStrings?: string[];
  /**
   * Called with each piece of final text of sequence `index` (streaming), with the token that
   * completed it and the policy version that sampled that token.
   */
  onText?(index: number, delta: string, tokenId: number, logprob: number, version: number, top?: TopLogprobs): void;
  /** Aborts every sequence of the request (client disconnected). */
  signal?: AbortSignal;
}

/** One sequence's output as it grows: detokenization and stop strings. */
class SequenceState {
  readonly tokenIds: number[] = [];
  readonly logprobs: number[] = [];
  readonly versions: number[] = [];
  readonly topLogprobs: TopLogprobs[] = [];
  readonly routes: Int32Array[] = [];
  text = '';
  promptLogprobs?: Float32Array;
  promptRoutes?: Int32Array;
  private emitted = 0;
  private stoppedByString = false;
  private readonly detok?: IncrementalDetokenizer;
  private readonly stops: string[];
  private readonly holdBack: number;

  constructor(
    private readonly opts: SequenceOptions,
    private readonly index: number,
    /** Stop strings end nothing before this many tokens (vLLM's min_tokens; the engine holds back stop tokens). */
    private readonly minTokens = 0,
  ) {
    this.detok = opts.tokenizer ? new IncrementalDetokenizer(opts.tokenizer, { skipSpecialTokens: true }) : undefined;
    this.stops = opts.stopStrings ?? [];
    this.holdBack = this.stops.length ? Math.max(...this.stops.map((s) => s.length)) - 1 : 0;
  }

  private emit(upTo: number, tokenId: number, logprob: number, version: number, top?: TopLogprobs): void {
    if (this.opts.onText && upTo > this.emitted) {
      this.opts.onText(this.index, this.text.slice(this.emitted, upTo), tokenId, logprob, version, top);
      this.emitted = upTo;
    }
  }

  /** Returns true when a stop string ended the sequence. */
  token(token: number, logprob: number, version: number, top?: TopLogprobs, routes?: Int32Array): boolean {
    this.tokenIds.push(token);
    this.logprobs.push(logprob);
    this.versions.push(version);
    if (routes) this.routes.push(routes);
    if (top) this.topLogprobs.push(top);
    if (!this.detok) return false;
    const from = Math.max(0, this.text.length - this.holdBack);
    this.text += this.detok.push([token]);
    for (const s of this.tokenIds.length > this.minTokens ? this.stops : []) {
      const at = this.text.indexOf(s, from);
      if (at >= 0) {
        this.text = this.text.slice(0, at);
        this.stoppedByString = true;
      }
    }
    this.emit(
      this.stoppedByString ? this.text.length : Math.max(this.emitted, this.text.length - this.holdBack),
      token,
      logprob,
      version,
      top,
    );
    return this.stoppedByString;
  }

  finish(reason: Exclude<FinishReason, 'error'>, policyVersion: number): SequenceResult {
    if (this.detok && !this.stoppedByString) {
      this.text += this.detok.flush();
      this.emit(
        this.text.length,
        this.tokenIds[this.tokenIds.length - 1] ?? -1,
        this.logprobs[this.logprobs.length - 1] ?? 0,
        this.versions[this.versions.length - 1] ?? policyVersion,
      );
    }
    const { tokenIds, logprobs, topLogprobs, text, promptLogprobs, promptRoutes, routes, versions } = this;
    const range: [number, number] = versions.length
      ? versions.reduce<[number, number]>(([lo, hi], v) => [Math.min(lo, v), Math.max(hi, v)], [Infinity, -Infinity])
      : [policyVersion, policyVersion];
    return {
      tokenIds,
      logprobs,
      topLogprobs,
      text,
      finishReason: this.stoppedByString ? 'stop' : reason,
      policyVersion,
      tokenPolicyVersions: versions,
      policyVersionRange: range,
      promptLogprobs,
      promptRoutes,
      routes,
    };
  }
}

/**
 * Queues all sequences of one request now (throws QueueFullError, LimitError or
 * ShuttingDownError, having queued none) and returns their results, in order, once all finished.
 */
export function startSequences(
  scheduler: Scheduler,
  requests: readonly (GenerationRequest & { maxTokens: number })[],
  opts: SequenceOptions = {},
): Promise<SequenceResult[]> {
  const states = requests.map((r, i) => new SequenceState(opts, i, r.minTokens));
  const results: (SequenceResult | undefined)[] = new Array(requests.length);
  let left = requests.length;
  let failure: EngineError | undefined;
  let settle!: { resolve(r: SequenceResult[]): void; reject(e: Error): void };
  const done = new Promise<SequenceResult[]>((resolve, reject) => (settle = { resolve, reject }));
  let handles: SequenceHandle[] = [];
  const cancelAll = () => handles.forEach((h) => h.cancel());

  const callbacks = (i: number): SequenceCallbacks => ({
    onAdmitted: (p, routes) => {
      states[i].promptLogprobs = p;
      states[i].promptRoutes = routes;
    },
    onToken: (token, logprob, version, top, routes) => states[i].token(token, logprob, version, top, routes),
    onFinish: (reason, policyVersion, error) => {
      if (reason === 'error') {
        // One failed sequence fails the request: stop generating the rest of it.
        failure ??= new EngineError(
          error?.code ?? 'prefill_failed',
          error?.message ?? 'the engine failed a sequence of this request',
        );
        cancelAll();
      } else results[i] = states[i].finish(reason, policyVersion);
      if (--left > 0) return;
      opts.signal?.removeEventListener('abort', cancelAll);
      if (failure) settle.reject(failure);
      else settle.resolve(results as SequenceResult[]);
    },
  });
  handles = scheduler.submitAll(requests.map((request, i) => ({ request, callbacks: callbacks(i) })));
  // One listener per request (not per sequence): n up to 64 stays under MaxListeners' warning.
  if (opts.signal?.aborted) cancelAll();
  else opts.signal?.addEventListener('abort', cancelAll);
  return done;
}
