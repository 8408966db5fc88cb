/**
 * One rollout: an environment's example played against the policy through `/v1/generate`, with the
 * model's chat template applied here.
 *
 * Token accounting is what makes the importance ratios right: the rollout is one growing token
 * sequence. Turn 1's prompt is the rendered chat; the model's tokens are kept exactly as sampled
 * (with their logprobs); the environment's reply is appended as the tokens of the *difference*
 * between rendering the chat before and after it, so earlier turns are never re-tokenised and every
 * completion token keeps its inference logprob. A template without the prefix property (rendering a
 * longer chat changes the text of an earlier turn) cannot be extended this way and errors the rollout.
 */
import { renderChat, type ChatMessage } from '../model/chat';
import type { Tokenizer } from '../model/tokenizer';
import type { EnvPool, EnvCallResult } from '../envs/pool';
import type { EnvSpec } from '../envs/loader';
import type { EnvironmentInfo, Example, JsonObject, Message } from '../envs/types';
import type { TokenSegment } from './packing';
import { InferenceError, type GenerateParams, type InferenceClient } from './client';

export interface SamplingSettings {
  temperature: number;
  top_p: number;
  top_k: number;
  min_p: number;
  /** Per turn; unset = the rest of the context. */
  max_tokens?: number;
  /** Stop strings; a turn's message content ends before the first. */
  stop?: string[];
}

export interface RolloutTask {
  env: EnvSpec;
  info: EnvironmentInfo;
  example: Example;
  /** Seed of this rollout's sampling; turn t uses seed + t. */
  seed: number;
  /** Context length: prompt + all turns must fit. */
  seqLen: number;
  sampling: SamplingSettings;
}

export interface Rollout {
  /** The conversation after the prompt: assistant turns and environment replies. */
  completion: Message[];
  /** Token segments in order: prompt, turn 1, env reply 1, turn 2, ... */
  segments: TokenSegment[];
  reward: number;
  metrics: Record<string, number>;
  turns: number;
  /** Tokens the model sampled over all turns. */
  completionTokens: number;
  /** The rollout ran out of context before the environment ended it. */
  truncated: boolean;
  /** Lowest policy version that produced any of the tokens. */
  policyVersion: number;
  /** Set when the rollout failed; it is then kept out of training. */
  error?: string;
}

class RolloutError extends Error {}

function unwrap<T>(r: EnvCallResult<T>, what: string): T {
  if (r.ok) return r.value;
  throw new RolloutError(`environment ${what} ${r.kind === 'error' ? 'failed' : r.kind === 'timeout' ? 'timed out' : 'crashed'}: ${r.error}`);
}

/** Renders a chat, and checks it extends `prefix` (the template's prefix property). */
function renderExtending(tokenizer: Tokenizer, prefix: string, messages: Message[], tools: EnvironmentInfo['tools'], addGenerationPrompt: boolean): string {
  const text = renderChat(tokenizer, messages as ChatMessage[], { tools, addGenerationPrompt });
  if (!text.startsWith(prefix)) {
    throw new RolloutError('the chat template renders an earlier part of the conversation differently once it grows (no prefix property), so the rollout\'s tokens cannot be extended');
  }
  return text;
}

/** The rendered prompt of an example (chat template with the generation prompt) and its tokens: turn 1's input. */
export function renderPrompt(tokenizer: Tokenizer, prompt: readonly Message[], tools: EnvironmentInfo['tools']): { text: string; ids: number[] } {
  const text = renderChat(tokenizer, prompt as ChatMessage[], { tools, addGenerationPrompt: true });
  return { text, ids: tokenizer.encode(text) };
}

const PROMPT_TOO_LONG = 'prompt too long: ';

/** Why a prompt of `promptTokens` tokens cannot be sampled from within `seqLen`, or undefined when it can. */
export function promptTooLong(promptTokens: number, seqLen: number): string | undefined {
  return promptTokens + 1 > seqLen
    ? `${PROMPT_TOO_LONG}the prompt is ${promptTokens} tokens, which leaves no room to generate within seq_len ${seqLen} (it needs at least ${promptTokens + 1})`
    : undefined;
}

/** Whether a rollout's error is `promptTooLong`'s: the example was skipped, nothing failed. */
export function isPromptTooLong(error: string | undefined): boolean {
  return error?.startsWith(PROMPT_TOO_LONG) ?? false;
}

export async function runRollout(task: RolloutTask, pool: EnvPool, client: InferenceClient, tokenizer: Tokenizer): Promise<Rollout> {
  const { env, info, example } = task;
  const tools = info.tools;
  const messages: Message[] = [...example.prompt];
  /** The template's text of the conversation so far; the ids stand for it (the model's own tokens as sampled). */
  const prompt = renderPrompt(tokenizer, messages, tools);
  let rendered = prompt.text;
  const ids: number[] = prompt.ids;
  const segments: TokenSegment[] = [{ tokens: [...ids], generated: false }];
  const rollout: Rollout = {
    completion: [], segments, reward: 0, metrics: {}, turns: 0, completionTokens: 0, truncated: false, policyVersion: Infinity,
  };
  try {
    // A prompt with no room for one generated token would make a rollout that trains nothing.
    const tooLong = promptTooLong(ids.length, task.seqLen);
    if (tooLong) throw new RolloutError(tooLong);
    let state = unwrap(await pool.init(env, example), 'init') as JsonObject;
    for (let turn = 1; ; turn++) {
      const room = task.seqLen - ids.length;
      if (room < 1) {
        rollout.truncated = true;
        break;
      }
      const params: GenerateParams = {
        temperature: task.sampling.temperature,
        top_p: task.sampling.top_p,
        top_k: task.sampling.top_k,
        min_p: task.sampling.min_p,
        max_tokens: Math.min(room, task.sampling.max_tokens ?? room),
        seed: (task.seed + turn) % 2 ** 31,
        ...(task.sampling.stop?.length ? { stop: task.sampling.stop } : {}),
      };
      const out = await client.generate(ids, params);
      if (out.finishReason === 'abort') throw new RolloutError('inference aborted the request');
      segments.push({ tokens: out.tokenIds, generated: true, logprobs: out.logprobs });
      ids.push(...out.tokenIds);
      rollout.turns = turn;
      rollout.completionTokens += out.tokenIds.length;
      rollout.policyVersion = Math.min(rollout.policyVersion, out.policyVersion);
      // The stop token (e.g. <|im_end|>) ends the turn; the message content is what came before it.
      const stopped = out.finishReason === 'stop';
      const contentIds = stopped ? out.tokenIds.slice(0, -1) : out.tokenIds;
      const reply: Message = { role: 'assistant', content: contentBeforeStop(tokenizer.decode(out.tokenIds), task.sampling.stop) ?? tokenizer.decode(contentIds) };
      messages.push(reply);
      rollout.completion.push(reply);
      // A turn cut by max_tokens still ends the turn; only a full context ends the rollout early.
      if (!stopped && ids.length >= task.seqLen) {
        rollout.truncated = true;
        break;
      }
      if (turn >= info.maxTurns) break;
      const response = unwrap(await pool.respond(env, { example, messages, state, turn }), 'respond');
      if (response.state) state = response.state as JsonObject;
      if (response.done) break;
      const added = response.messages ?? [];
      if (added.length === 0) throw new RolloutError(`environment ${env.id} neither ended the rollout nor replied at turn ${turn}`);
      // Text the template puts after the reply's content (e.g. "<|im_end|>\n"); the sampled stop
      // token already stands for its first special token when they match.
      const upToContent = rendered + reply.content;
      const closed = renderExtending(tokenizer, upToContent, messages, tools, false);
      let closing = closed.slice(upToContent.length);
      const stopText = stopped ? tokenizer.decode(out.tokenIds.slice(-1)) : '';
      if (stopText && closing.startsWith(stopText)) closing = closing.slice(stopText.length);
      messages.push(...added);
      rollout.completion.push(...added);
      const next = renderExtending(tokenizer, closed, messages, tools, true);
      const deltaIds = tokenizer.encode(closing + next.slice(closed.length));
      segments.push({ tokens: deltaIds, generated: false });
      ids.push(...deltaIds);
      rendered = next;
    }
    const score = unwrap(await pool.score(env, { example, messages, completion: rollout.completion, state }), 'score');
    rollout.reward = score.reward;
    rollout.metrics = score.metrics;
  } catch (e) {
    // The rollout's own failures (environment errors, an unextendable template, a request the
    // server rejects as invalid) error this rollout only. An unreachable or failing server fails
    // the whole activity, which Temporal retries once the server is back; a server that refuses
    // the run itself (API key, 404) fails the run (InferenceError.kind, client.ts).
    const own = e instanceof RolloutError || (e instanceof InferenceError && e.rejectsRequest);
    if (!own) throw e;
    rollout.error = (e as Error).message;
  }
  if (rollout.policyVersion === Infinity) rollout.policyVersion = -1;
  return rollout;
}

/** The text before the first stop string in `text`, or undefined when none occurs (a stop token ended the turn, or its length). */
function contentBeforeStop(text: string, stops: readonly string[] | undefined): string | undefined {
  const at = Math.min(...(stops ?? []).map((s) => text.indexOf(s)).filter((i) => i >= 0));
  return Number.isFinite(at) ? text.slice(0, at) : undefined;
}
