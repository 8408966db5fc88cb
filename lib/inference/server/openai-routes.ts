/**
 * The OpenAI-compatible routes: `/v1/models`, `/v1/chat/completions` (streaming, tools, logprobs)
 * and `/v1/completions` (logprobs; `echo`, with the prompt tokens' logprobs: what online
 * distillation asks a teacher for, lib/orchestrator/teacher.ts). One function per route, each
 * given the server's `Served` (its scheduler, tokenizer, prompt helpers and limits).
 */
import { randomUUID } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type * as native from '../../../native';
import type { ChatMessage } from '../../model/chat';
import type { Tokenizer } from '../../model/tokenizer';
import { EngineError, type SequenceResult } from '../generation';
import type { Scheduler } from '../scheduler';
import {
  ApiError,
  chatCompletionRequest,
  completionRequest,
  parseBody,
  type ChatCompletionRequest,
  type RequestMessage,
} from '../protocol';
import { pathTooDeep } from '../../json';
import { engineErrorBody } from './errors';
import { LazyArray, mapInSlices, sendJson } from './json-body';
import { disconnectSignal, MAX_RENDERED_CHARS, now, promptLogprobList, usage, type Served } from './served';

/** Text of an OpenAI message content (string or text parts). */
function contentText(m: RequestMessage): string | null {
  if (m.content === undefined || m.content === null) return null;
  return typeof m.content === 'string' ? m.content : m.content.map((p) => p.text).join('');
}

/** `<tool_call>{json}</tool_call>` blocks (Qwen/Hermes format) in an assistant reply. */
function parseToolCalls(text: string): {
  content: string;
  calls: { id: string; type: 'function'; function: { name: string; arguments: string } }[];
} {
  const calls: { id: string; type: 'function'; function: { name: string; arguments: string } }[] = [];
  const content = text.replace(/<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g, (whole, body: string) => {
    try {
      const parsed = JSON.parse(body) as { name?: unknown; arguments?: unknown };
      // A model may write anything: arguments nested beyond what JSON.stringify can recurse stay text.
      if (typeof parsed.name !== 'string' || pathTooDeep(parsed)) return whole;
      calls.push({
        id: `call_${randomUUID().replace(/-/g, '').slice(0, 24)}`,
        type: 'function',
        function: { name: parsed.name, arguments: JSON.stringify(parsed.arguments ?? {}) },
      });
      return '';
    } catch {
      return whole;
    }
  });
  return { content: content.trim(), calls };
}

/** The OpenAI routes on `served`. */
export function registerOpenAiRoutes(app: FastifyInstance, served: Served): void {
  app.get('/v1/models', () => listModels(served));
  app.post('/v1/chat/completions', (req, reply) => chatCompletions(served, req, reply));
  app.post('/v1/completions', (req, reply) => completions(served, req, reply));
}

/** `/v1/models`: the one model served, with its context and the policy version it serves. */
export async function listModels({ modelName, contextLength, scheduler }: Served) {
  return {
    object: 'list',
    data: [
      {
        id: modelName,
        object: 'model',
        created: now(),
        owned_by: 'prime-rl',
        max_model_len: contextLength,
        policy_version: scheduler.policy.version,
      },
    ],
  };
}

/** `/v1/chat/completions`: the chat rendered by the model's template, `n` choices, streamed or whole. */
export async function chatCompletions(served: Served, req: FastifyRequest, reply: FastifyReply) {
  const { scheduler, tokenizer, modelName, contextLength } = served;
  // Before the body is validated: checking half a million messages takes the event loop longer
  // than refusing them.
  const count = (req.body as { messages?: unknown } | null)?.messages;
  if (Array.isArray(count) && count.length >= contextLength)
    throw new ApiError(
      400,
      `messages: ${count.length} messages cannot fit this model's context of ${contextLength} tokens (each renders to at least one token)`,
      'messages',
      'context_length_exceeded',
    );
  const body = parseBody(chatCompletionRequest, req.body);
  served.checkModel(body.model);
  if (body.top_logprobs && !body.logprobs)
    throw new ApiError(400, 'top_logprobs: requires logprobs: true', 'top_logprobs');
  // Watched from the start: a client that leaves while its prompt is tokenized runs nothing.
  const signal = disconnectSignal(reply);
  const promptIds = await chatPrompt(served, body);
  served.checkPrompt(promptIds, 'messages');
  const maxParam =
    body.max_completion_tokens !== undefined && body.max_completion_tokens !== null
      ? 'max_completion_tokens'
      : 'max_tokens';
  const maxTokens = served.maxTokensFor(promptIds.length, body.max_completion_tokens ?? body.max_tokens, maxParam);
  const n = body.n ?? 1;
  const id = `chatcmpl-${randomUUID()}`;
  const created = now();
  const stopStrings = stopList(body.stop);
  const withTools = (body.tools?.length ?? 0) > 0;
  const top = body.logprobs ? (body.top_logprobs ?? 0) : 0;
  if (!body.stream)
    served.checkResponseEntries(n * maxTokens * (1 + top), `n x ${maxParam} x (1 + top_logprobs)`, maxParam);
  served.checkSampling(body, maxTokens);
  const requests = Array.from({ length: n }, (_, i) => served.engineRequest(promptIds, body, maxTokens, i, false, top));

  if (body.stream) {
    // A chunk with a token names the version that sampled it; the others, the version served.
    const chunk = (index: number, delta: object, extra: object = {}, version = scheduler.policy.version) => ({
      id,
      object: 'chat.completion.chunk',
      created,
      model: modelName,
      policy_version: version,
      choices: [{ index, delta, logprobs: null, finish_reason: null, ...extra }],
    });
    // Queued before any header is sent: a refused request is a plain 429/400, not a broken stream.
    // No token can arrive before the stream below exists (tokens come from a later decode step).
    const done = served.start(requests, {
      tokenizer,
      stopStrings,
      signal,
      onText: (i, delta, tokenId, logprob, version, top) => {
        const lp = body.logprobs ? { content: [logprobEntry(tokenizer, tokenId, logprob, top)] } : null;
        stream.send(chunk(i, { content: delta }, { logprobs: lp }, version));
      },
    });
    const stream = startStream(reply, signal, scheduler);
    try {
      for (let i = 0; i < n; i++) stream.send(chunk(i, { role: 'assistant', content: '' }));
      const results = await done;
      if (signal.aborted) return;
      results.forEach((r, i) =>
        stream.send(
          chunk(i, {}, { finish_reason: r.finishReason, ...(body.return_token_ids ? { token_ids: r.tokenIds } : {}) }),
        ),
      );
      if (body.stream_options?.include_usage) {
        stream.send({
          id,
          object: 'chat.completion.chunk',
          created,
          model: modelName,
          choices: [],
          usage: usage(promptIds.length, results),
        });
      }
    } catch (e) {
      // Headers are out: the error travels as an event, as OpenAI and vLLM send it.
      stream.send(
        e instanceof EngineError
          ? engineErrorBody(e, scheduler)
          : new ApiError(500, `internal error: ${(e as Error).message}`, null, null, 'server_error').body(),
      );
    } finally {
      stream.end();
    }
    return;
  }

  const results = await served.start(requests, { tokenizer, stopStrings, signal });
  return sendJson(reply, {
    id,
    object: 'chat.completion',
    created,
    model: modelName,
    policy_version: Math.min(...results.map((r) => r.policyVersion)),
    choices: results.map((r, index) => {
      const { content, calls } = withTools ? parseToolCalls(r.text) : { content: r.text, calls: [] };
      return {
        index,
        message: {
          role: 'assistant',
          content: calls.length && !content ? null : content,
          ...(calls.length ? { tool_calls: calls } : {}),
        },
        logprobs: body.logprobs ? { content: tokenLogprobs(tokenizer, r) } : null,
        finish_reason: calls.length ? 'tool_calls' : r.finishReason,
        policy_version_range: r.policyVersionRange,
        ...(body.return_token_ids ? { token_ids: r.tokenIds } : {}),
      };
    }),
    usage: usage(promptIds.length, results),
    ...(body.return_token_ids ? { prompt_token_ids: promptIds } : {}),
  });
}

/** `/v1/completions`: prompts as texts or ids, `n` choices each; `echo` with the prompt's logprobs. */
export async function completions(served: Served, req: FastifyRequest, reply: FastifyReply) {
  const { tokenizer, prompts, modelName } = served;
  const body = parseBody(completionRequest, req.body);
  served.checkModel(body.model);
  if (body.stream) throw new ApiError(400, 'stream: streaming is supported on /v1/chat/completions only', 'stream');
  const echo = body.echo ?? false;
  const withLogprobs = body.logprobs !== undefined && body.logprobs !== null;
  if (body.max_tokens === 0 && !echo)
    throw new ApiError(400, 'max_tokens: 0 generates nothing; it is accepted only with echo: true', 'max_tokens');
  // The engine computes the logprob of each prompt token, not its alternatives.
  if (echo && body.logprobs)
    throw new ApiError(
      400,
      `logprobs: ${body.logprobs} top logprobs of the echoed prompt tokens are not supported; with echo use logprobs: 0`,
      'logprobs',
    );
  const signal = disconnectSignal(reply);
  const prompt = body.prompt;
  let promptIds: number[][];
  let promptTexts: string[] | undefined;
  if (typeof prompt === 'string' || prompt.every((p) => typeof p === 'string')) {
    promptTexts = typeof prompt === 'string' ? [prompt] : (prompt as string[]);
    // Every text is bounded before any is tokenized.
    promptTexts.forEach((t) => served.checkTextLength(t, 'prompt'));
    promptIds = (await Promise.all(promptTexts.map((t) => prompts.encode(t)))).map((o) =>
      served.promptIds(o, 'prompt'),
    );
  } else {
    promptIds = prompt.every((p) => typeof p === 'number') ? [prompt as number[]] : (prompt as number[][]);
  }
  promptIds.forEach((p) => {
    if (p.length === 0) throw new ApiError(400, 'prompt: empty prompt', 'prompt');
    served.checkPrompt(p, 'prompt');
  });
  const n = body.n ?? 1;
  const stopStrings = stopList(body.stop);
  // max_tokens 0 (echo): the engine, which always generates, makes one token; it is not returned.
  const generates = body.max_tokens !== 0;
  const requests = promptIds.flatMap((p) => {
    const maxTokens = served.maxTokensFor(p.length, generates ? (body.max_tokens ?? 16) : 1, 'max_tokens');
    served.checkSampling(body, generates ? maxTokens : 0);
    // The n choices of a prompt echo the same prompt: its logprobs are computed once, by the first.
    return Array.from({ length: n }, (_, i) =>
      served.engineRequest(p, body, maxTokens, i, echo && withLogprobs && i === 0, body.logprobs ?? 0),
    );
  });
  const entries = requests.reduce(
    (a, r) => a + r.maxTokens * (1 + (body.logprobs ?? 0)) + (echo ? r.promptIds.length : 0),
    0,
  );
  served.checkResponseEntries(
    entries,
    'prompts x n x (max_tokens x (1 + logprobs) + echoed prompt tokens)',
    'max_tokens',
  );
  const results = await served.start(requests, { tokenizer, stopStrings, signal });
  const generated = results.map((r) =>
    generates
      ? r
      : {
          ...r,
          tokenIds: [],
          logprobs: [],
          topLogprobs: [],
          text: '',
          finishReason: 'length' as const,
          policyVersionRange: [r.policyVersion, r.policyVersion] as [number, number],
        },
  );
  const choices = [];
  for (const [index, r] of generated.entries()) {
    const p = Math.floor(index / n);
    const echoed = echo
      ? {
          ids: promptIds[p],
          text: promptTexts?.[p] ?? tokenizer.decode(promptIds[p]),
          logprobs: withLogprobs ? promptLogprobList(results[p * n])! : [],
        }
      : { ids: [], text: '', logprobs: [] };
    choices.push({
      index,
      text: echoed.text + r.text,
      logprobs: withLogprobs
        ? await completionLogprobs(
            tokenizer,
            [...echoed.ids, ...r.tokenIds],
            [...echoed.logprobs, ...r.logprobs],
            body.logprobs ? r.topLogprobs : null,
          )
        : null,
      finish_reason: r.finishReason,
      policy_version_range: r.policyVersionRange,
      ...(body.return_token_ids ? { token_ids: r.tokenIds, prompt_token_ids: promptIds[p] } : {}),
    });
  }
  return sendJson(reply, {
    id: `cmpl-${randomUUID()}`,
    object: 'text_completion',
    created: now(),
    model: modelName,
    policy_version: Math.min(...results.map((r) => r.policyVersion)),
    choices,
    usage: usage(
      promptIds.reduce((a, p) => a + p.length * n, 0),
      generated,
    ),
  });
}

/** OpenAI chat logprob entry of one token, with its top alternatives. */
function logprobEntry(tokenizer: Tokenizer, id: number, logprob: number, top?: native.TopLogprobs) {
  const token = tokenizer.decode([id]);
  return {
    token,
    logprob,
    bytes: [...Buffer.from(token, 'utf8')],
    top_logprobs: top
      ? Array.from(top.ids, (alt, j) => {
          const t = tokenizer.decode([alt]);
          return { token: t, logprob: top.logprobs[j], bytes: [...Buffer.from(t, 'utf8')] };
        })
      : [],
  };
}

/** Made as the body is written: millions of entries must not be built at once (json-body.ts). */
function tokenLogprobs(tokenizer: Tokenizer, r: SequenceResult) {
  return new LazyArray(r.tokenIds.length, (i) =>
    logprobEntry(tokenizer, r.tokenIds[i], r.logprobs[i], r.topLogprobs[i]),
  );
}

function stopList(stop: string | string[] | null | undefined): string[] {
  return stop === undefined || stop === null ? [] : typeof stop === 'string' ? [stop] : stop;
}

/**
 * The chat rendered by the model's template and tokenized, on a prompt worker (prompts.ts). What
 * cannot fit the context is refused first, without rendering: every message renders to at least
 * its content's tokens (templates show each message's content), and to at least one token (the
 * route checks the count before anything else).
 */
async function chatPrompt(served: Served, body: ChatCompletionRequest): Promise<number[]> {
  const { tokenizer, prompts, contextLength } = served;
  const messages: ChatMessage[] = body.messages.map((m) => ({
    ...m,
    role: m.role === 'developer' ? 'system' : m.role,
    content: contentText(m),
    reasoning_content: m.reasoning_content ?? undefined,
    tool_calls: m.tool_calls as ChatMessage['tool_calls'],
  }));
  let atLeast = 0;
  for (const m of messages) atLeast += m.content ? tokenizer.minTokens(m.content) : 0;
  served.checkTokenBound(atLeast, 'messages');
  if (tokenizer.chatTemplate === undefined)
    throw new ApiError(
      400,
      'messages: this model has no chat template (tokenizer_config.json or chat_template.jinja); use /v1/completions',
      'messages',
      'invalid_messages',
    );
  const outcome = await prompts.chat(
    messages,
    {
      tools: body.tools ?? undefined,
      addGenerationPrompt: body.add_generation_prompt ?? true,
      extra: body.chat_template_kwargs ?? undefined,
    },
    { maxChars: MAX_RENDERED_CHARS, contextLength },
  );
  return served.promptIds(outcome, 'messages');
}

/** Server-sent events for a streaming response. It always ends: with [DONE], after an error event when it failed. */
function startStream(reply: FastifyReply, signal: AbortSignal, scheduler: Scheduler) {
  reply.hijack();
  reply.raw.writeHead(200, {
    'content-type': 'text/event-stream',
    'cache-control': 'no-cache',
    connection: 'keep-alive',
    'x-policy-version': String(scheduler.policy.version),
  });
  // Nothing is written once the client is gone.
  const open = () => !signal.aborted && !reply.raw.writableEnded && !reply.raw.destroyed;
  return {
    send: (data: unknown) => {
      if (open()) reply.raw.write(`data: ${JSON.stringify(data)}\n\n`);
    },
    end: () => {
      if (!open()) return;
      reply.raw.write('data: [DONE]\n\n');
      reply.raw.end();
    },
  };
}

/**
 * OpenAI's (legacy) completion `logprobs` of `ids`: `text_offset` is where each token's text starts
 * in the choice's text, the lengths of the tokens before it summed (as vLLM counts). Decoded in
 * slices, the alternatives as the body is written (json-body.ts).
 */
async function completionLogprobs(
  tokenizer: Tokenizer,
  ids: number[],
  logprobs: (number | null)[],
  top: native.TopLogprobs[] | null,
) {
  const tokens = await mapInSlices(ids.length, (i) => tokenizer.decode([ids[i]]));
  const offsets: number[] = [];
  let at = 0;
  for (const t of tokens) {
    offsets.push(at);
    at += t.length;
  }
  const topLogprobs = top
    ? new LazyArray(top.length, (i) =>
        Object.fromEntries(Array.from(top[i].ids, (alt, j) => [tokenizer.decode([alt]), top[i].logprobs[j]])),
      )
    : null;
  return { tokens, token_logprobs: logprobs, top_logprobs: topLogprobs, text_offset: offsets };
}
