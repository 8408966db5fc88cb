/**
 * A rollout against an external OpenAI-compatible API, where token ids are not available: text in,
 * text out through `/chat/completions`, played by the episode driver (episode.ts) as token
 * rollouts are. For evaluation only (RL needs the token ids and logprobs of `runRollout`).
 */
import type { EnvPool } from '../envs/pool';
import type { EnvironmentInfo, Message } from '../envs/types';
import { classifyStatus, httpErrorText, InferenceError } from './client';
import type { Episode } from '../runfolder/rollouts';
import { playEpisode, type EpisodeTask } from './episode';
import type { SamplingSettings } from './token-rollout';

export interface ChatApi {
  /** e.g. `https://api.example.com/v1`. */
  baseUrl: string;
  model: string;
  apiKey?: string;
  timeoutMs?: number;
}

export interface ChatRolloutTask extends EpisodeTask {
  seed: number;
  sampling: SamplingSettings;
}

export interface ChatRollout extends Episode {
  /** As the API reports it (usage.completion_tokens), summed over turns. */
  completionTokens: number;
}

async function chat(
  api: ChatApi,
  messages: readonly Message[],
  tools: EnvironmentInfo['tools'],
  sampling: SamplingSettings,
  seed: number,
) {
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
  // An external API: a 4xx (but 429) errors this rollout, the rest fails the activity (classifyStatus).
  if (!res.ok)
    throw new InferenceError(
      `${url}: ${httpErrorText(res.status, text)}`,
      res.status,
      classifyStatus(res.status, 'external'),
    );
  const json = JSON.parse(text) as { choices: { message: Message }[]; usage?: { completion_tokens?: number } };
  return { message: json.choices[0].message, completionTokens: json.usage?.completion_tokens ?? 0 };
}

export async function runChatRollout(task: ChatRolloutTask, pool: EnvPool, api: ChatApi): Promise<ChatRollout> {
  let completionTokens = 0;
  const episode = await playEpisode(task, pool, {
    async act(messages, turn) {
      const out = await chat(api, messages, task.info.tools, task.sampling, (task.seed + turn) % 2 ** 31);
      completionTokens += out.completionTokens;
      return { reply: { ...out.message, role: 'assistant', content: out.message.content ?? '' } };
    },
  });
  return { ...episode, completionTokens };
}
