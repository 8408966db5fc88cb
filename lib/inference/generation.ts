/**
 * One generated sequence, as the HTTP routes need it: tokens and their logprobs, text decoded as it
 * grows, OpenAI `stop` strings (the text is cut before the match), and streaming of text deltas
 * that can no longer turn into a stop string.
 */
import type { GenerationRequest, TopLogprobs } from '../../native';
import { IncrementalDetokenizer, type Tokenizer } from '../model/tokenizer';
import type { Scheduler, SequenceHandle } from './scheduler';

export type FinishReason = 'stop' | 'length' | 'abort';

export interface SequenceResult {
  tokenIds: number[];
  logprobs: number[];
  /** Per token, when the request asked for top logprobs. */
  topLogprobs: TopLogprobs[];
  text: string;
  finishReason: FinishReason;
  policyVersion: number;
  promptLogprobs?: Float32Array;
}

export interface SequenceOptions {
  /** Decode text (routes that return text); /v1/generate returns tokens only. */
  tokenizer?: Tokenizer;
  stopStrings?: string[];
  /** Called with each piece of final text (streaming), with the token that completed it. */
  onText?(delta: string, tokenId: number, logprob: number, top?: TopLogprobs): void;
  /** Aborts the sequence (client disconnected). */
  signal?: AbortSignal;
}

/** Runs one sequence through the scheduler; resolves when it finishes (or is aborted). */
export function runSequence(
  scheduler: Scheduler,
  request: GenerationRequest & { maxTokens: number },
  opts: SequenceOptions = {},
): Promise<SequenceResult> {
  return new Promise((resolve, reject) => {
    const tokenIds: number[] = [];
    const logprobs: number[] = [];
    const topLogprobs: TopLogprobs[] = [];
    const detok = opts.tokenizer ? new IncrementalDetokenizer(opts.tokenizer, { skipSpecialTokens: true }) : undefined;
    const stops = opts.stopStrings ?? [];
    const holdBack = stops.length ? Math.max(...stops.map((s) => s.length)) - 1 : 0;
    let text = '';
    let emitted = 0;
    let stoppedByString = false;
    let promptLogprobs: Float32Array | undefined;

    const emit = (upTo: number, tokenId: number, logprob: number, top?: TopLogprobs) => {
      if (opts.onText && upTo > emitted) {
        opts.onText(text.slice(emitted, upTo), tokenId, logprob, top);
        emitted = upTo;
      }
    };

    let handle: SequenceHandle;
    try {
      handle = scheduler.submit(request, {
        onAdmitted: (p) => {
          promptLogprobs = p;
        },
        onToken: (token, logprob, _version, top) => {
          tokenIds.push(token);
          logprobs.push(logprob);
          if (top) topLogprobs.push(top);
          if (!detok) return false;
          const from = Math.max(0, text.length - holdBack);
          text += detok.push([token]);
          for (const s of stops) {
            const at = text.indexOf(s, from);
            if (at >= 0) {
              text = text.slice(0, at);
              stoppedByString = true;
            }
          }
          emit(stoppedByString ? text.length : Math.max(emitted, text.length - holdBack), token, logprob, top);
          return stoppedByString;
        },
        onFinish: (reason, policyVersion) => {
          opts.signal?.removeEventListener('abort', abort);
          if (detok && !stoppedByString) {
            text += detok.flush();
            emit(text.length, tokenIds[tokenIds.length - 1] ?? -1, logprobs[logprobs.length - 1] ?? 0);
          }
          resolve({ tokenIds, logprobs, topLogprobs, text, finishReason: stoppedByString ? 'stop' : reason, policyVersion, promptLogprobs });
        },
      });
    } catch (e) {
      reject(e);
      return;
    }
    const abort = () => handle.cancel();
    if (opts.signal?.aborted) abort();
    else opts.signal?.addEventListener('abort', abort);
  });
}
