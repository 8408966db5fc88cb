/**
 * A rollout against an external OpenAI-compatible API, where token ids are not available: text in,
 * text out through `/chat/completions`, the environment's turns and rubric as in `runRollout`.
 * For evaluation only (RL needs the token ids and logprobs of `runRollout`).
 */
import type { EnvPool, EnvCallResult } from '../envs/pool';
import type { EnvSpec } from '../envs/loader';
import type { EnvironmentInfo, Example, JsonObject, Message } from '../envs/types';
import { InferenceError } from './client';
import type { SamplingSettings } from './rollout';

export interface ChatApi {
  /** e.g. `https://api.example.com/v1`. */
  baseUrl: string;
  model: string;
  apiKey?: string;
  timeoutMs?: number;
}

export interface ChatRolloutTask {
  env: EnvSpec;
  info: EnvironmentInfo;
  example: Example;
  seed: number;
  sampling: SamplingSettings;
}

export interface ChatRollout {
  completion: Message[];
  reward: number;
  metrics: Record<string, number>;
  /** As the API reports it (usage.completion_tokens), summed over turns. */
  completionTokens: number;
  error?: string;
}

class ChatRolloutError extends Error {}

function unwrap<T>(r: EnvCallResult<T>, what: string): T {
  if (r.ok) return r.value;
  throw new ChatRolloutError(`environment ${what} failed: ${r.error}`);
}

async function chat(api: ChatApi, messages: Message[], tools: EnvironmentInfo['tools'], sampling: SamplingSettings, seed: number) {
  const url = `${api.baseUrl.replace(/\/+$/, '')}/chat/completions`;
  const body = {
    model: api.model,
    messages,
    ...(tools.length > 0 ? { tools } : {}),
    temperature: sampling.temperature,
    top_p: sampling.top_p,
    ...(sampling.max_tokens !== undefined ? { max_tokens: sampling.max_tokens } : {}),
    seed,
  };
  let res: Response;
  try {
    res = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(api.apiKey ? { authorization: `Bearer ${api.apiKey}` } : {}) },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(api.timeoutMs ?? 600_000),
    });
  } catch (e) {
    throw new InferenceError(`${url} unreachable: ${(e as Error).message}`, undefined, 'unavailable');
  }
  const text = await res.text();
  // An external API: any 4xx but 429 errors the rollout (a wrong key errors them all, and the eval
  // fails with it); the rest fails the activity, which Temporal retries.
  if (!res.ok) throw new InferenceError(`${url}: HTTP ${res.status}: ${text.slice(0, 500)}`, res.status, res.status >= 400 && res.status < 500 && res.status !== 429 ? 'request' : 'unavailable');
  const json = JSON.parse(text) as { choices: { message: Message }[]; usage?: { completion_tokens?: number } };
  return { message: json.choices[0].message, completionTokens: json.usage?.completion_tokens ?? 0 };
}

export async function runChatRollout(task: ChatRolloutTask, pool: EnvPool, api: ChatApi): Promise<ChatRollout> {
  const { env, info, example } = task;
  const messages: Message[] = [...example.prompt];
  const rollout: ChatRollout = { completion: [], reward: 0, metrics: {}, completionTokens: 0 };
  try {
    let state = unwrap(await pool.init(env, example), 'init') as JsonObject;
    for (let turn = 1; ; turn++) {
      const out = await chat(api, messages, info.tools, task.sampling, (task.seed + turn) % 2 ** 31);
      const reply: Message = { ...out.message, role: 'assistant', content: out.message.content ?? '' };
      messages.push(reply);
      rollout.completion.push(reply);
      rollout.completionTokens += out.completionTokens;
      if (turn >= info.maxTurns) break;
      const response = unwrap(await pool.respond(env, { example, messages, state, turn }), 'respond');
      if (response.state) state = response.state as JsonObject;
      if (response.done) break;
      const added = response.messages ?? [];
      if (added.length === 0) throw new ChatRolloutError(`environment ${env.id} neither ended the rollout nor replied at turn ${turn}`);
      messages.push(...added);
      rollout.completion.push(...added);
    }
    const score = unwrap(await pool.score(env, { example, messages, completion: rollout.completion, state }), 'score');
    rollout.reward = score.reward;
    rollout.metrics = score.metrics;
  } catch (e) {
    // As in runRollout: the rollout's own failures error it; an unreachable or failing API fails the activity.
    const own = e instanceof ChatRolloutError || (e instanceof InferenceError && e.rejectsRequest);
    if (!own) throw e;
    rollout.error = (e as Error).message;
  }
  return rollout;
}
