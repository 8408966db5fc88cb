/**
 * One token rollout: an environment's example played against the policy through `/v1/generate`
 * (the episode driver, episode.ts), with the model's chat template applied here.
 *
 * Token accounting is what makes the importance ratios right: every token the model sampled is
 * trained on exactly as sampled, with its inference logprob, in the context it was sampled in.
 * Turn 1's prompt is the rendered chat. After the environment's reply, the chat is rendered again:
 * where the template renders the conversation so far as the text the tokens stand for (the prefix
 * property), the reply is appended as the tokens of the difference, so earlier turns are never
 * re-tokenised and the rollout stays one sequence. Where it does not (Qwen3's template drops the
 * `<think>` blocks of earlier turns once a new user turn follows), the next turn's prompt is the
 * re-rendered chat, and a new training sample starts there: a rollout is one or more consecutive
 * samples, each the exact context of its sampled tokens (as prime-rl splits such trajectories).
 */
import { renderChat, type ChatMessage } from '../model/chat';
import type { Tokenizer } from '../model/tokenizer';
import type { EnvPool } from '../envs/pool';
import type { EnvironmentInfo, Message } from '../envs/types';
import type { TokenSegment } from '../runfolder/packing';
import type { GenerateParams, InferenceClient } from './client';
import type { Episode, Rollout } from '../runfolder/rollouts';
import { EpisodeError, playEpisode, type EpisodeTask, type Player } from './episode';

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

export interface RolloutTask extends EpisodeTask {
  /** Seed of this rollout's sampling; turn t uses seed + t. */
  seed: number;
  /** Context length: each sample's prompt and turns must fit. */
  seqLen: number;
  sampling: SamplingSettings;
  /** MoE router replay (`trainer.moe.router_replay`): keep inference's routes on the samples. */
  routerReplay?: boolean;
}

/** The rendered prompt of an example (chat template with the generation prompt) and its tokens: turn 1's input. */
export function renderPrompt(
  tokenizer: Tokenizer,
  prompt: readonly Message[],
  tools: EnvironmentInfo['tools'],
): { text: string; ids: number[] } {
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

/** Samples turns through `/v1/generate`, keeping the token samples of the rollout. */
class TokenPlayer implements Player {
  readonly samples: TokenSegment[][] = [];
  completionTokens = 0;
  truncated = false;
  policyVersion = Infinity;
  newestPolicyVersion = -1;
  /** The current sample's tokens: the next turn's prompt. */
  private ids: number[] = [];
  /** The template's text that `ids` stand for (the model's own tokens as sampled, decoded). */
  private rendered = '';
  /** The decoded stop token that ended the last turn ('' when max_tokens cut it). */
  private stopText = '';

  constructor(
    private readonly task: RolloutTask,
    private readonly client: InferenceClient,
    private readonly tokenizer: Tokenizer,
    prompt: { text: string; ids: number[] },
  ) {
    this.startSample(prompt.text, prompt.ids);
  }

  private startSample(text: string, ids: number[]): void {
    this.rendered = text;
    this.ids = [...ids];
    this.samples.push([{ tokens: ids, generated: false }]);
  }

  private get sample(): TokenSegment[] {
    return this.samples[this.samples.length - 1];
  }

  async act(_messages: readonly Message[], turn: number): Promise<{ reply: Message; last?: boolean } | undefined> {
    const { seqLen, sampling } = this.task;
    const room = seqLen - this.ids.length;
    if (room < 1) {
      this.truncated = true;
      return undefined;
    }
    const params: GenerateParams = {
      temperature: sampling.temperature,
      top_p: sampling.top_p,
      top_k: sampling.top_k,
      min_p: sampling.min_p,
      max_tokens: Math.min(room, sampling.max_tokens ?? room),
      seed: (this.task.seed + turn) % 2 ** 31,
      ...(sampling.stop?.length ? { stop: sampling.stop } : {}),
      ...(this.task.routerReplay ? { return_routes: true } : {}),
    };
    const out = await this.client.generate(this.ids, params);
    if (out.finishReason === 'abort') throw new EpisodeError('inference aborted the request');
    const versions = out.tokenPolicyVersions;
    const promptLength = this.ids.length;
    this.sample.push({ tokens: out.tokenIds, generated: true, logprobs: out.logprobs, versions });
    // Decode step i fed the token at position P - 1 + i; the prefill fed positions 0..P-2.
    this.keepRoutes(out.routes, promptLength - 1);
    this.keepRoutes(out.promptRoutes, 0);
    this.ids.push(...out.tokenIds);
    this.completionTokens += out.tokenIds.length;
    for (const v of versions.length > 0 ? versions : [out.policyVersion]) {
      this.policyVersion = Math.min(this.policyVersion, v);
      this.newestPolicyVersion = Math.max(this.newestPolicyVersion, v);
    }
    // The stop token (e.g. <|im_end|>) ends the turn; the message content is what came before it.
    const stopped = out.finishReason === 'stop';
    const content =
      contentBeforeStop(this.tokenizer.decode(out.tokenIds), sampling.stop) ??
      this.tokenizer.decode(stopped ? out.tokenIds.slice(0, -1) : out.tokenIds);
    const reply: Message = { role: 'assistant', content };
    this.rendered += reply.content;
    this.stopText = stopped ? this.tokenizer.decode(out.tokenIds.slice(-1)) : '';
    // A turn cut by max_tokens still ends the turn; only a full context ends the rollout early.
    if (!stopped && this.ids.length >= seqLen) {
      this.truncated = true;
      return { reply, last: true };
    }
    return { reply };
  }

  /**
   * Router replay: `rows[i]` are the experts of the current sample's token at position `from + i`.
   * Routes already known are kept: a sampled token keeps the routes of the decode step that fed it
   * when a later turn's prefill recomputes them (they differ at most by numerics). Tokens no
   * request fed (the last one sampled) stay -1: the trainer's router decides there.
   */
  private keepRoutes(rows: readonly (readonly number[])[] | undefined, from: number): void {
    if (!rows?.length) return;
    const width = rows[0].length;
    let at = 0;
    for (const seg of this.sample) {
      const n = seg.tokens.length;
      if (!seg.routes) seg.routes = new Array<number>(n * width).fill(-1);
      const routes = seg.routes as number[];
      for (let p = Math.max(from, at); p < Math.min(from + rows.length, at + n); p++) {
        const row = rows[p - from];
        if (row.length !== width) throw new Error(`inference returned routes of ${row.length} and ${width} experts`);
        if (routes[(p - at) * width] < 0) for (let k = 0; k < width; k++) routes[(p - at) * width + k] = row[k];
      }
      at += n;
    }
  }

  observe(messages: readonly Message[]): void {
    const next = renderChat(this.tokenizer, messages as ChatMessage[], {
      tools: this.task.info.tools,
      addGenerationPrompt: true,
    });
    if (!next.startsWith(this.rendered)) {
      // The template renders an earlier turn differently now: the next turn is sampled from the
      // re-rendered chat, which starts a new sample.
      this.startSample(next, this.tokenizer.encode(next));
      return;
    }
    // What the template puts after the reply's content (e.g. "<|im_end|>\n"), the environment's
    // messages and the generation prompt; the sampled stop token already stands for the first
    // special token when they match.
    let start = this.rendered.length;
    if (this.stopText && next.startsWith(this.stopText, start)) start += this.stopText.length;
    const delta = next.slice(start);
    const deltaIds = this.tokenizer.encode(delta);
    this.sample.push({ tokens: deltaIds, generated: false, roles: this.roleSpans(messages, start, delta, deltaIds) });
    this.ids.push(...deltaIds);
    this.rendered = next;
  }

  /**
   * The environment's messages after the last reply as spans of `deltaIds` (what observe appended,
   * starting at character `start` of the chat), each message with the template's scaffold around
   * it; the generation prompt at the end counts with the last one. Where the template does not
   * render the chat up to a message as a prefix, the whole delta is one span of the first
   * message's role.
   */
  private roleSpans(
    messages: readonly Message[],
    start: number,
    delta: string,
    deltaIds: readonly number[],
  ): { role: string; tokens: number }[] {
    let first = messages.length;
    while (first > 0 && messages[first - 1].role !== 'assistant') first--;
    if (first >= messages.length) return [{ role: 'unknown', tokens: deltaIds.length }];
    const spans: { role: string; tokens: number }[] = [];
    let done = 0;
    for (let k = first + 1; k < messages.length; k++) {
      const upTo = renderChat(this.tokenizer, messages.slice(0, k) as ChatMessage[], {
        tools: this.task.info.tools,
        addGenerationPrompt: false,
      });
      const end = upTo.length - start;
      if (!upTo.startsWith(this.rendered) || end < 0 || end > delta.length)
        return [{ role: messages[first].role, tokens: deltaIds.length }];
      const tokens = Math.min(deltaIds.length, this.tokenizer.encode(delta.slice(0, end)).length);
      spans.push({ role: messages[k - 1].role, tokens: tokens - done });
      done = tokens;
    }
    spans.push({ role: messages[messages.length - 1].role, tokens: deltaIds.length - done });
    return spans;
  }
}

export async function runRollout(
  task: RolloutTask,
  pool: EnvPool,
  client: InferenceClient,
  tokenizer: Tokenizer,
): Promise<Rollout> {
  const prompt = renderPrompt(tokenizer, task.example.prompt, task.info.tools);
  const player = new TokenPlayer(task, client, tokenizer, prompt);
  // A prompt with no room for one generated token would make a rollout that trains nothing.
  const tooLong = promptTooLong(prompt.ids.length, task.seqLen);
  const episode: Episode = tooLong
    ? { completion: [], reward: 0, metrics: {}, turns: 0, error: tooLong }
    : await playEpisode(task, pool, player);
  return {
    ...episode,
    samples: player.samples.filter((segments) => segments.some((s) => s.generated)),
    completionTokens: player.completionTokens,
    truncated: player.truncated,
    policyVersion: player.policyVersion === Infinity ? -1 : player.policyVersion,
    newestPolicyVersion: player.newestPolicyVersion,
  };
}

/** The text before the first stop string in `text`, or undefined when none occurs (a stop token ended the turn, or its length). */
function contentBeforeStop(text: string, stops: readonly string[] | undefined): string | undefined {
  const at = Math.min(...(stops ?? []).map((s) => text.indexOf(s)).filter((i) => i >= 0));
  return Number.isFinite(at) ? text.slice(0, at) : undefined;
}
