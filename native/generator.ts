/**
 * Batched generation over a model's paged KV cache (native/src/addon/generator_wrap.cc). Its options,
 * step times and counters are the engine's X-macro lists (native/src/generation.h), generated into
 * engine-types.generated.ts.
 */
import type { GeneratorCounters, StateSlotStats, StepTimes } from './engine-types.generated';
import type { TokenIds } from './rows';
import type { SerialQueue } from './serial';

export interface GenerationRequest {
  promptIds: TokenIds;
  /** 0 = greedy. Default 1. */
  temperature?: number;
  /** Default 1 (off). */
  topP?: number;
  /** -1 = off (default). */
  topK?: number;
  /** Default 0 (off). */
  minP?: number;
  /**
   * OpenAI's and vLLM's penalties on the tokens sampled so far (the prompt's not counted): each
   * logit minus frequencyPenalty x the token's count, and presencePenalty once it occurred.
   * Default 0. These, logitBias and minTokens change the logits before temperature: the tokens'
   * logprobs and top logprobs are of the distribution sampled from.
   */
  presencePenalty?: number;
  frequencyPenalty?: number;
  /** Added to these tokens' logits (OpenAI's logit_bias). */
  logitBias?: { tokenIds: number[]; biases: number[] };
  /** The stop tokens are not sampled before this many tokens (vLLM's min_tokens). Default 0. */
  minTokens?: number;
  /** Default 16. */
  maxTokens?: number;
  stopTokenIds?: number[];
  /** Same seed, same tokens, whatever else is in the batch. Random when absent. */
  seed?: number;
  /** Return raw (temperature 1) logprobs of the prompt tokens. */
  promptLogprobs?: boolean;
  /** 0..20: with every token, the k most likely tokens (OpenAI `top_logprobs`). Default 0. */
  topLogprobs?: number;
  /** MoE: return the experts each fed token was routed to (`promptRoutes`, `StepToken.routes`). */
  returnRoutes?: boolean;
  /**
   * Lower runs first (vLLM's priority, default 0): when the KV cache runs dry a step preempts the
   * highest value (the latest admitted among equals), and preempted sequences resume lowest first.
   */
  priority?: number;
}

/** The most likely tokens of one step, descending by logprob (ties: lower id first). */
export interface TopLogprobs {
  ids: Int32Array;
  logprobs: number[];
}

export interface AddedSequence {
  seqId: number;
}

export interface StepToken {
  seqId: number;
  token: number;
  /**
   * log softmax(logits / temperature)[token] over the full vocabulary, before top-k/top-p/min-p
   * filtering (greedy: temperature 1). This is the sampled-token logprob the trainer recomputes.
   */
  logprob: number;
  finished: boolean;
  /**
   * 'stop' (a stop token was sampled; it is included), 'length' (maxTokens or cache full), or
   * 'error' (no token: the logits were not finite, see `error`; the sequence is gone).
   */
  finishReason?: 'stop' | 'length' | 'error';
  /** Why the sequence failed, with finishReason 'error' (token is then -1). */
  error?: string;
  /** When the request asked for topLogprobs: from the same distribution as `logprob`. */
  topLogprobs?: TopLogprobs;
  /**
   * With returnRoutes on an MoE model: the experts (sparse layers x experts per token) of the
   * token fed in this step, whose output `token` was sampled from.
   */
  routes?: Int32Array;
  /** The sequence's first token (which carries the prompt's outputs below, when asked for). */
  first?: boolean;
  /** With the first token, when asked: one logprob per prompt token, NaN for the first. */
  promptLogprobs?: Float32Array;
  /**
   * With the first token and returnRoutes on an MoE model: the experts of prompt tokens 0..P-2
   * (the last one's are this token's `routes`), [P - 1, sparse layers, experts per token] flattened.
   */
  promptRoutes?: Int32Array;
}

/** The cache's state and counters (native/src/generation.h `GeneratorStats`, and the generator's sizes). */
export interface CacheStats extends GeneratorCounters {
  /** Sequences added and not finished: running, or preempted (waiting to be recomputed). */
  activeSequences: number;
  maxSequences: number;
  maxSequenceLength: number;
  blockSize: number;
  numBlocks: number;
  /** numBlocks x blockSize: no request needing more positions can run. */
  capacityTokens: number;
  /** blocksInUse / numBlocks. */
  cacheUsage: number;
  /** Hybrid models only: their per-sequence state slots (native/src/state_slots.h). */
  state?: StateSlotStats;
  /** CUDA graphs of the decode step captured so far. */
  cudaGraphs: number;
  /** Why decode steps run eagerly, op by op ('' while CUDA graphs serve them). */
  eagerReason: string;
  /** Where the steps' time went since creation. */
  times: StepTimes;
}

/** @internal The addon's generator object. */
export interface RawGenerator {
  add(requests: GenerationRequest[]): Promise<AddedSequence[]>;
  step(maxSteps?: number): Promise<StepToken[]>;
  remove(seqIds: number[]): Promise<boolean[]>;
  stats(): CacheStats;
}

/**
 * Batched generation over a paged KV cache. Sequences join with `add` (as many as the cache has
 * room for) and leave when finished (automatically) or with `remove`; every `step` computes a
 * decode row for each running sequence and prefill chunks of the sequences still reading their
 * prompt, in one batch.
 */
export class Generator {
  /** @internal use NativeModel.createGenerator */
  constructor(
    private readonly raw: RawGenerator,
    private readonly queue: SerialQueue,
  ) {}

  /**
   * Admits the longest leading run of the requests the cache has room for now (sequence slots,
   * the blocks of their prompts; none while preempted sequences wait) and returns their ids; the
   * others are for a later call. Rejects, admitting nothing, when a request is invalid or needs
   * more positions than the cache holds. Their tokens, the first included, come out of `step`.
   */
  add(requests: GenerationRequest[]): Promise<AddedSequence[]> {
    return this.queue.run(() => this.raw.add(requests));
  }

  /**
   * One step for every running sequence; finished ones free their blocks. With maxSteps > 1 and
   * nothing to prefill, up to maxSteps decode steps run in one call (tokens fed back on the
   * device, read once): a sequence's tokens are the same either way.
   */
  step(maxSteps = 1): Promise<StepToken[]> {
    return this.queue.run(() => this.raw.step(maxSteps));
  }

  /** Aborts sequences (running or preempted) and frees their blocks; false for ids not active. */
  remove(seqIds: number[]): Promise<boolean[]> {
    return this.queue.run(() => this.raw.remove(seqIds));
  }

  /** The cache's state and counters, as of the last completed call. */
  stats(): CacheStats {
    return this.raw.stats();
  }
}
