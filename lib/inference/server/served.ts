/**
 * What the routes share: the served model (engine scheduler, tokenizer, context) and the checks and
 * engine requests every generation route builds on it.
 */
import * as path from 'node:path';
import type { FastifyReply } from 'fastify';
import type { ArchConfig } from '../../model/arch';
import type { Tokenizer } from '../../model/tokenizer';
import { startSequences, type SequenceOptions, type SequenceResult } from '../generation';
import { ApiError } from '../protocol';
import type { Scheduler } from '../scheduler';
import type { PromptOutcome, PromptWorkers } from '../prompts';

/** Sampling settings as the generation routes' bodies carry them. */
export interface Sampling {
  temperature?: number | null;
  top_p?: number | null;
  top_k?: number | null;
  min_p?: number | null;
  seed?: number | null;
  stop_token_ids?: number[] | null;
  ignore_eos?: boolean | null;
  min_tokens?: number | null;
  presence_penalty?: number | null;
  frequency_penalty?: number | null;
  logit_bias?: Record<string, number> | null;
}

export type EngineRequest = ReturnType<Served['engineRequest']>;

export const now = () => Math.floor(Date.now() / 1000);

/** Aborts when the client goes away before the response is complete. */
export function disconnectSignal(reply: FastifyReply): AbortSignal {
  const ctrl = new AbortController();
  reply.raw.on('close', () => {
    if (!reply.raw.writableFinished) ctrl.abort();
  });
  return ctrl.signal;
}

/** Largest accepted request body. */
export const BODY_LIMIT = 16 * 1024 * 1024;

/**
 * The longest text a chat template may render, in UTF-16 units: twice the largest request body, so
 * a template may add its markup to every message of the largest chat, not megabytes more.
 */
export const MAX_RENDERED_CHARS = 2 * BODY_LIMIT;

export class Served {
  constructor(
    readonly scheduler: Scheduler,
    readonly tokenizer: Tokenizer,
    /** Renders chat templates and tokenizes prompts off the event loop. */
    readonly prompts: PromptWorkers,
    readonly arch: ArchConfig,
    /** Tokens of prompt + completion: seq_len, at most the model's positions. */
    readonly contextLength: number,
    /** The model name requests must name (if any): model.name. */
    readonly modelName: string,
    /** server.max_response_entries: see checkResponseEntries. */
    readonly maxResponseEntries: number,
  ) {}

  /**
   * Refuses, before anything runs, a non-streamed response of more than server.max_response_entries
   * token entries (`formula`, over the request's fields, says how they were counted).
   */
  checkResponseEntries(entries: number, formula: string, param: string): void {
    if (entries > this.maxResponseEntries)
      throw new ApiError(
        400,
        `${param}: ${formula} = ${entries} entries in one response, more than server.max_response_entries (${this.maxResponseEntries}); ask for fewer, or stream the response`,
        param,
        'response_too_large',
      );
  }

  checkModel(name: string | undefined): void {
    if (name !== undefined && name !== this.modelName)
      throw new ApiError(
        404,
        `model '${name}' does not exist; this server serves '${this.modelName}'`,
        'model',
        'model_not_found',
      );
  }

  /**
   * The ids of a prompt the workers prepared, or the error that says why there are none: what a
   * template or tokenizer did wrong is named with its file (400), a failed helper is ours (500).
   * `param`: the request field the prompt came from.
   */
  promptIds(outcome: PromptOutcome, param: string): number[] {
    if ('ids' in outcome) return outcome.ids;
    if ('error' in outcome)
      throw new ApiError(500, `internal error: ${outcome.error}`, null, 'prompt_worker_failed', 'server_error');
    const chat = param === 'messages';
    const what = chat
      ? `the chat template (${this.tokenizer.chatTemplateSource ?? 'none'})`
      : `the tokenizer (${path.join(this.prompts.dir, 'tokenizer.json')})`;
    const fail = (code: string, message: string) => new ApiError(400, `${param}: ${message}`, param, code);
    switch (outcome.refused) {
      case 'context':
        throw this.contextExceeded(param, `at least ${outcome.atLeast}`);
      case 'template':
        throw fail('invalid_messages', `the chat template cannot render them: ${outcome.message}`);
      case 'too_large':
        throw fail(
          'chat_template_output_too_large',
          `${what} rendered ${outcome.chars} characters, more than the ${MAX_RENDERED_CHARS} a prompt may have`,
        );
      case 'timeout':
        throw fail(
          chat ? 'chat_template_timeout' : 'tokenizer_timeout',
          `${what} did not finish within ${this.prompts.options.timeoutMs / 1000} s (server.prompt_timeout_s) and was stopped`,
        );
      case 'memory':
        throw fail(
          chat ? 'chat_template_out_of_memory' : 'tokenizer_out_of_memory',
          `${what} needed more than the ${this.prompts.options.heapMb} MiB a prompt's helper process may use (server.prompt_heap_mb) and was stopped`,
        );
    }
  }

  private contextExceeded(param: string, what: string): ApiError {
    return new ApiError(
      400,
      `${param}: the prompt has ${what} tokens; this model's context is ${this.contextLength} tokens`,
      param,
      'context_length_exceeded',
    );
  }

  checkPrompt(ids: readonly number[], param: string): void {
    const bad = ids.findIndex((t) => t >= this.arch.vocabSize);
    if (bad >= 0)
      throw new ApiError(
        400,
        `${param}: token id ${ids[bad]} at index ${bad} is outside the vocabulary (size ${this.arch.vocabSize})`,
        param,
        'invalid_token_id',
      );
    if (ids.length >= this.contextLength) throw this.contextExceeded(param, String(ids.length));
  }

  /** Refuses, without tokenizing, a text whose token count cannot be below the context. */
  checkTextLength(text: string, param: string): void {
    this.checkTokenBound(this.tokenizer.minTokens(text), param);
  }

  /** Refuses a prompt of at least `atLeast` tokens (a lower bound) when that already reaches the context. */
  checkTokenBound(atLeast: number, param: string): void {
    if (atLeast >= this.contextLength) throw this.contextExceeded(param, `at least ${atLeast}`);
  }

  maxTokensFor(promptLength: number, asked: number | null | undefined, param: string): number {
    const room = this.contextLength - promptLength;
    if (asked === undefined || asked === null) return room;
    if (asked > room) {
      throw new ApiError(
        400,
        `${param}: ${asked} new tokens do not fit: prompt ${promptLength} + ${asked} > context ${this.contextLength}`,
        param,
        'context_length_exceeded',
      );
    }
    return asked;
  }

  /**
   * Refuses sampling settings the engine cannot take, naming the field (`prefix`: where the
   * route's body keeps them): a logit_bias token outside the vocabulary, min_tokens beyond the
   * tokens the request may make.
   */
  checkSampling(s: Sampling, maxTokens: number, prefix = ''): void {
    const bad = Object.keys(s.logit_bias ?? {}).find((id) => Number(id) >= this.arch.vocabSize);
    if (bad !== undefined)
      throw new ApiError(
        400,
        `${prefix}logit_bias: token id ${bad} is outside the vocabulary (size ${this.arch.vocabSize})`,
        `${prefix}logit_bias`,
        'invalid_token_id',
      );
    if ((s.min_tokens ?? 0) > maxTokens)
      throw new ApiError(
        400,
        `${prefix}min_tokens: ${s.min_tokens} is more than the ${maxTokens} tokens the request may make (max_tokens, or the context left)`,
        `${prefix}min_tokens`,
        'invalid_value',
      );
  }

  /** The engine request for choice `i` of `n`: seeds differ per choice so n samples differ. */
  engineRequest(
    promptIds: number[],
    s: Sampling,
    maxTokens: number,
    i: number,
    promptLogprobs = false,
    topLogprobs = 0,
    returnRoutes = false,
  ) {
    return {
      promptIds,
      temperature: s.temperature ?? 1,
      topP: s.top_p ?? 1,
      topK: s.top_k ?? -1,
      minP: s.min_p ?? 0,
      seed: s.seed === undefined || s.seed === null ? undefined : s.seed + i,
      stopTokenIds: [...(s.ignore_eos ? [] : this.tokenizer.eosTokenIds), ...(s.stop_token_ids ?? [])],
      minTokens: s.min_tokens ?? 0,
      presencePenalty: s.presence_penalty ?? 0,
      frequencyPenalty: s.frequency_penalty ?? 0,
      logitBias: s.logit_bias
        ? { tokenIds: Object.keys(s.logit_bias).map(Number), biases: Object.values(s.logit_bias) }
        : undefined,
      maxTokens,
      promptLogprobs,
      topLogprobs,
      returnRoutes,
    };
  }

  /** Queues every sequence of a request, all or none (throws 429 / 400 / 503 before anything runs). */
  start(requests: EngineRequest[], opts: SequenceOptions): Promise<SequenceResult[]> {
    return startSequences(this.scheduler, requests, opts);
  }
}

/**
 * The logprob of each prompt token given the ones before it, as the engine computed them for a
 * request with `promptLogprobs` (raw: temperature 1); the first token has none (null).
 */
export function promptLogprobList(r: SequenceResult): (number | null)[] | null {
  return r.promptLogprobs ? Array.from(r.promptLogprobs, (v, i) => (i === 0 ? null : v)) : null;
}

export function usage(promptTokens: number, results: SequenceResult[]) {
  const completion = results.reduce((a, r) => a + r.tokenIds.length, 0);
  return { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion };
}
