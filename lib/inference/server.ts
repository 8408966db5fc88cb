/**
 * The policy server: an OpenAI-compatible HTTP API over the native engine with continuous batching
 * (scheduler.ts), plus the routes RL needs: token-in `/v1/generate`, `/update_weights`,
 * `/reload_weights`. Every response names the policy version that produced it (`policy_version`).
 *
 * Bad input never reaches the engine: bodies are validated (protocol.ts), prompts are checked
 * against the context and the vocabulary, and any error a client caused is a 4xx with an
 * OpenAI-style body naming the field.
 */
import { randomUUID } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import * as native from '../../native';
import type { InferenceConfig } from '../config/schemas';
import type { ArchConfig } from '../model/arch';
import { applyChatTemplate, type ChatMessage } from '../model/chat';
import { loadHfModel } from '../model/hf';
import { Tokenizer } from '../model/tokenizer';
import { runSequence, type SequenceResult } from './generation';
import { InferenceMetrics } from './metrics';
import {
  ApiError,
  chatCompletionRequest,
  completionRequest,
  generateRequest,
  parseBody,
  updateWeightsRequest,
  type ChatCompletionRequest,
  type RequestMessage,
} from './protocol';
import { QueueFullError, Scheduler, ShuttingDownError } from './scheduler';

/** Largest accepted request body. */
const BODY_LIMIT = 16 * 1024 * 1024;

export interface InferenceServer {
  app: FastifyInstance;
  scheduler: Scheduler;
  /** Base URL once listening, e.g. http://127.0.0.1:8000 */
  url: string;
  /** Stops admitting, lets running requests finish (up to `graceMs`), closes the HTTP server. */
  close(graceMs?: number): Promise<void>;
}

const now = () => Math.floor(Date.now() / 1000);

function sameShape(a: ArchConfig, b: ArchConfig): string | undefined {
  for (const k of Object.keys(a) as (keyof ArchConfig)[]) {
    if (a[k] !== b[k]) return `${k} is ${JSON.stringify(b[k])}, the served model has ${JSON.stringify(a[k])}`;
  }
  return undefined;
}

/** Text of an OpenAI message content (string or text parts). */
function contentText(m: RequestMessage): string | null {
  if (m.content === undefined || m.content === null) return null;
  return typeof m.content === 'string' ? m.content : m.content.map((p) => p.text).join('');
}

/** `<tool_call>{json}</tool_call>` blocks (Qwen/Hermes format) in an assistant reply. */
function parseToolCalls(text: string): { content: string; calls: { id: string; type: 'function'; function: { name: string; arguments: string } }[] } {
  const calls: { id: string; type: 'function'; function: { name: string; arguments: string } }[] = [];
  const content = text.replace(/<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g, (whole, body: string) => {
    try {
      const parsed = JSON.parse(body) as { name?: unknown; arguments?: unknown };
      if (typeof parsed.name !== 'string') return whole;
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

export async function startInferenceServer(config: InferenceConfig): Promise<InferenceServer> {
  native.setThreads(config.threads ?? os.cpus().length);
  const baseDir = path.resolve(config.model.name);
  const base = loadHfModel(baseDir);
  const tokenizer = Tokenizer.fromDir(baseDir);
  const model = await native.loadModel(base.config, base.tensors, { device: config.model.device, dtype: config.model.dtype });
  const contextLength = Math.min(config.seq_len, base.config.maxPositionEmbeddings);
  const generator = model.createGenerator({ maxSequences: config.max_running, maxSequenceLength: contextLength });
  const scheduler = new Scheduler(
    model,
    generator,
    {
      maxRunning: config.max_running,
      maxQueued: config.max_queued,
      kvCacheTokens: config.kv_cache_tokens ?? config.max_running * contextLength,
    },
    { version: 0, weightDir: baseDir },
  );
  const modelName = config.model.name;
  const allowedRoots = (config.allowed_weight_roots ?? [config.output_dir]).map((r) => path.resolve(r));
  const apiKey = config.server.api_key_var ? process.env[config.server.api_key_var] : undefined;
  if (config.server.api_key_var && !apiKey) {
    throw new Error(`server.api_key_var names ${config.server.api_key_var}, but that environment variable is empty`);
  }
  const metrics = new InferenceMetrics(scheduler);
  let closing = false;

  const app = Fastify({ bodyLimit: BODY_LIMIT, logger: false });

  app.setErrorHandler((error: Error & { statusCode?: number; code?: string }, _req, reply) => {
    if (error instanceof ApiError) return reply.status(error.status).send(error.body());
    if (error instanceof QueueFullError) return reply.status(429).send(new ApiError(429, error.message, null, 'queue_full', 'rate_limit_error').body());
    if (error instanceof ShuttingDownError) return reply.status(503).send(new ApiError(503, error.message, null, 'shutting_down', 'server_error').body());
    const status = error.statusCode && error.statusCode >= 400 && error.statusCode < 500 ? error.statusCode : 500;
    const message = status === 500 ? `internal error: ${error.message}` : error.message;
    return reply.status(status).send(new ApiError(status, message, null, error.code ?? null, status === 500 ? 'server_error' : 'invalid_request_error').body());
  });
  app.setNotFoundHandler((req, reply) => {
    reply.status(404).send(new ApiError(404, `no route ${req.method} ${req.url}`).body());
  });
  app.addHook('onRequest', async (req) => {
    if (closing) throw new ShuttingDownError('server is shutting down');
    if (apiKey && req.url !== '/health' && req.headers.authorization !== `Bearer ${apiKey}`) {
      throw new ApiError(401, 'missing or invalid API key (Authorization: Bearer <key>)', null, 'invalid_api_key');
    }
  });
  app.addHook('onResponse', async (req, reply) => metrics.countRequest(req.routeOptions.url ?? 'unknown', reply.statusCode));
  app.addHook('onSend', async (_req, reply) => {
    reply.header('x-policy-version', String(scheduler.policy.version));
  });

  // ---- helpers shared by the generation routes ----

  const checkModel = (name: string | undefined) => {
    if (name !== undefined && name !== modelName) throw new ApiError(404, `model '${name}' does not exist; this server serves '${modelName}'`, 'model', 'model_not_found');
  };
  const checkPrompt = (ids: readonly number[], param: string) => {
    const bad = ids.findIndex((t) => t >= base.config.vocabSize);
    if (bad >= 0) throw new ApiError(400, `${param}: token id ${ids[bad]} at index ${bad} is outside the vocabulary (size ${base.config.vocabSize})`, param, 'invalid_token_id');
    if (ids.length >= contextLength) {
      throw new ApiError(400, `${param}: the prompt has ${ids.length} tokens; this model's context is ${contextLength} tokens`, param, 'context_length_exceeded');
    }
  };
  const maxTokensFor = (promptLength: number, asked: number | null | undefined, param: string): number => {
    const room = contextLength - promptLength;
    if (asked === undefined || asked === null) return room;
    if (asked > room) {
      throw new ApiError(400, `${param}: ${asked} new tokens do not fit: prompt ${promptLength} + ${asked} > context ${contextLength}`, param, 'context_length_exceeded');
    }
    return asked;
  };
  /** Aborts when the client goes away before the response is complete. */
  const disconnectSignal = (reply: FastifyReply): AbortSignal => {
    const ctrl = new AbortController();
    reply.raw.on('close', () => {
      if (!reply.raw.writableFinished) ctrl.abort();
    });
    return ctrl.signal;
  };
  const eosIds = tokenizer.eosTokenIds;

  interface Sampling {
    temperature?: number | null;
    top_p?: number | null;
    top_k?: number | null;
    min_p?: number | null;
    seed?: number | null;
    stop_token_ids?: number[] | null;
    ignore_eos?: boolean | null;
  }
  /** The engine request for choice `i` of `n`: seeds differ per choice so n samples differ. */
  const engineRequest = (promptIds: number[], s: Sampling, maxTokens: number, i: number, promptLogprobs = false, topLogprobs = 0) => ({
    promptIds,
    temperature: s.temperature ?? 1,
    topP: s.top_p ?? 1,
    topK: s.top_k ?? -1,
    minP: s.min_p ?? 0,
    seed: s.seed === undefined || s.seed === null ? undefined : s.seed + i,
    stopTokenIds: [...(s.ignore_eos ? [] : eosIds), ...(s.stop_token_ids ?? [])],
    maxTokens,
    promptLogprobs,
    topLogprobs,
  });
  const usage = (promptTokens: number, results: SequenceResult[]) => {
    const completion = results.reduce((a, r) => a + r.tokenIds.length, 0);
    return { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion };
  };
  const finishReason = (r: SequenceResult) => (r.finishReason === 'abort' ? 'abort' : r.finishReason);
  /** OpenAI chat logprob entry of one token, with its top alternatives. */
  const logprobEntry = (id: number, logprob: number, top?: native.TopLogprobs) => {
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
  };
  const tokenLogprobs = (r: SequenceResult) => r.tokenIds.map((id, i) => logprobEntry(id, r.logprobs[i], r.topLogprobs[i]));
  const stopList = (stop: string | string[] | null | undefined) => (stop === undefined || stop === null ? [] : typeof stop === 'string' ? [stop] : stop);

  const chatPrompt = (body: ChatCompletionRequest): number[] => {
    const messages: ChatMessage[] = body.messages.map((m) => ({
      ...m,
      role: m.role === 'developer' ? 'system' : m.role,
      content: contentText(m),
      reasoning_content: m.reasoning_content ?? undefined,
      tool_calls: m.tool_calls as ChatMessage['tool_calls'],
    }));
    try {
      return applyChatTemplate(tokenizer, messages, {
        tools: body.tools ?? undefined,
        addGenerationPrompt: body.add_generation_prompt ?? true,
        extra: body.chat_template_kwargs ?? undefined,
      });
    } catch (e) {
      throw new ApiError(400, `messages: the chat template cannot render them: ${(e as Error).message}`, 'messages', 'invalid_messages');
    }
  };

  /** Server-sent events for a streaming response. */
  const startStream = (reply: FastifyReply) => {
    reply.hijack();
    reply.raw.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
      'x-policy-version': String(scheduler.policy.version),
    });
    return {
      send: (data: unknown) => reply.raw.write(`data: ${JSON.stringify(data)}\n\n`),
      end: () => {
        reply.raw.write('data: [DONE]\n\n');
        reply.raw.end();
      },
    };
  };

  // ---- routes ----

  app.get('/health', async () => ({ status: 'ok', policy_version: scheduler.policy.version, weight_dir: scheduler.policy.weightDir }));

  app.get('/metrics', async (_req, reply) => {
    reply.header('content-type', metrics.registry.contentType);
    return metrics.registry.metrics();
  });

  app.get('/v1/models', async () => ({
    object: 'list',
    data: [{ id: modelName, object: 'model', created: now(), owned_by: 'prime-rl', max_model_len: contextLength, policy_version: scheduler.policy.version }],
  }));

  app.post('/v1/chat/completions', async (req: FastifyRequest, reply) => {
    const body = parseBody(chatCompletionRequest, req.body);
    checkModel(body.model);
    if (body.top_logprobs && !body.logprobs) throw new ApiError(400, 'top_logprobs: requires logprobs: true', 'top_logprobs');
    const promptIds = chatPrompt(body);
    checkPrompt(promptIds, 'messages');
    const maxParam = body.max_completion_tokens !== undefined && body.max_completion_tokens !== null ? 'max_completion_tokens' : 'max_tokens';
    const maxTokens = maxTokensFor(promptIds.length, body.max_completion_tokens ?? body.max_tokens, maxParam);
    const n = body.n ?? 1;
    const id = `chatcmpl-${randomUUID()}`;
    const created = now();
    const signal = disconnectSignal(reply);
    const stopStrings = stopList(body.stop);
    const withTools = (body.tools?.length ?? 0) > 0;

    if (body.stream) {
      const stream = startStream(reply);
      const chunk = (index: number, delta: object, extra: object = {}) => ({
        id, object: 'chat.completion.chunk', created, model: modelName, policy_version: scheduler.policy.version,
        choices: [{ index, delta, logprobs: null, finish_reason: null, ...extra }],
      });
      for (let i = 0; i < n; i++) stream.send(chunk(i, { role: 'assistant', content: '' }));
      const results = await Promise.all(
        Array.from({ length: n }, (_, i) =>
          runSequence(scheduler, engineRequest(promptIds, body, maxTokens, i, false, body.logprobs ? body.top_logprobs ?? 0 : 0), {
            tokenizer, stopStrings, signal,
            onText: (delta, tokenId, logprob, top) => {
              const lp = body.logprobs ? { content: [logprobEntry(tokenId, logprob, top)] } : null;
              stream.send(chunk(i, { content: delta }, { logprobs: lp }));
            },
          }),
        ),
      );
      if (signal.aborted) return;
      results.forEach((r, i) => stream.send(chunk(i, {}, { finish_reason: finishReason(r), ...(body.return_token_ids ? { token_ids: r.tokenIds } : {}) })));
      if (body.stream_options?.include_usage) {
        stream.send({ id, object: 'chat.completion.chunk', created, model: modelName, choices: [], usage: usage(promptIds.length, results) });
      }
      stream.end();
      return;
    }

    const results = await Promise.all(
      Array.from({ length: n }, (_, i) =>
        runSequence(scheduler, engineRequest(promptIds, body, maxTokens, i, false, body.logprobs ? body.top_logprobs ?? 0 : 0), { tokenizer, stopStrings, signal }),
      ),
    );
    return {
      id, object: 'chat.completion', created, model: modelName,
      policy_version: Math.min(...results.map((r) => r.policyVersion)),
      choices: results.map((r, index) => {
        const { content, calls } = withTools ? parseToolCalls(r.text) : { content: r.text, calls: [] };
        return {
          index,
          message: { role: 'assistant', content: calls.length && !content ? null : content, ...(calls.length ? { tool_calls: calls } : {}) },
          logprobs: body.logprobs ? { content: tokenLogprobs(r) } : null,
          finish_reason: calls.length ? 'tool_calls' : finishReason(r),
          ...(body.return_token_ids ? { token_ids: r.tokenIds } : {}),
        };
      }),
      usage: usage(promptIds.length, results),
      ...(body.return_token_ids ? { prompt_token_ids: promptIds } : {}),
    };
  });

  app.post('/v1/completions', async (req, reply) => {
    const body = parseBody(completionRequest, req.body);
    checkModel(body.model);
    if (body.stream) throw new ApiError(400, 'stream: streaming is supported on /v1/chat/completions only', 'stream');
    const prompts: number[][] =
      typeof body.prompt === 'string'
        ? [tokenizer.encode(body.prompt)]
        : body.prompt.every((p) => typeof p === 'string')
          ? (body.prompt as string[]).map((p) => tokenizer.encode(p))
          : body.prompt.every((p) => typeof p === 'number')
            ? [body.prompt as number[]]
            : (body.prompt as number[][]);
    prompts.forEach((p) => {
      if (p.length === 0) throw new ApiError(400, 'prompt: empty prompt', 'prompt');
      checkPrompt(p, 'prompt');
    });
    const n = body.n ?? 1;
    const signal = disconnectSignal(reply);
    const stopStrings = stopList(body.stop);
    const jobs = prompts.flatMap((p) => {
      const maxTokens = maxTokensFor(p.length, body.max_tokens ?? 16, 'max_tokens');
      return Array.from({ length: n }, (_, i) => runSequence(scheduler, engineRequest(p, body, maxTokens, i, false, body.logprobs ?? 0), { tokenizer, stopStrings, signal }));
    });
    const results = await Promise.all(jobs);
    return {
      id: `cmpl-${randomUUID()}`, object: 'text_completion', created: now(), model: modelName,
      policy_version: Math.min(...results.map((r) => r.policyVersion)),
      choices: results.map((r, index) => ({
        index,
        text: r.text,
        logprobs: body.logprobs !== undefined && body.logprobs !== null
          ? {
              tokens: r.tokenIds.map((t) => tokenizer.decode([t])),
              token_logprobs: r.logprobs,
              top_logprobs: body.logprobs ? r.topLogprobs.map((top) => Object.fromEntries(Array.from(top.ids, (alt, j) => [tokenizer.decode([alt]), top.logprobs[j]]))) : null,
              text_offset: null,
            }
          : null,
        finish_reason: finishReason(r),
        ...(body.return_token_ids ? { token_ids: r.tokenIds, prompt_token_ids: prompts[Math.floor(index / n)] } : {}),
      })),
      usage: usage(prompts.reduce((a, p) => a + p.length * n, 0), results),
    };
  });

  app.post('/v1/generate', async (req, reply) => {
    const body = parseBody(generateRequest, req.body);
    checkModel(body.model);
    checkPrompt(body.prompt_token_ids, 'prompt_token_ids');
    const maxTokens = maxTokensFor(body.prompt_token_ids.length, body.max_tokens, 'max_tokens');
    const signal = disconnectSignal(reply);
    const sampling = { ...body, stop_token_ids: body.stop_token_ids ?? null };
    const results = await Promise.all(
      Array.from({ length: body.n }, (_, i) =>
        runSequence(scheduler, engineRequest(body.prompt_token_ids, sampling, maxTokens, i, body.prompt_logprobs && i === 0), { signal }),
      ),
    );
    const promptLogprobs = results[0].promptLogprobs;
    return {
      id: `gen-${randomUUID()}`,
      model: modelName,
      policy_version: Math.min(...results.map((r) => r.policyVersion)),
      prompt_token_ids: body.prompt_token_ids,
      choices: results.map((r, index) => ({ index, token_ids: r.tokenIds, logprobs: r.logprobs, finish_reason: finishReason(r) })),
      usage: usage(body.prompt_token_ids.length, results),
      prompt_logprobs: body.prompt_logprobs && promptLogprobs ? Array.from(promptLogprobs, (v, i) => (i === 0 ? null : v)) : null,
    };
  });

  app.post('/update_weights', async (req) => {
    const body = parseBody(updateWeightsRequest, req.body);
    const dir = path.resolve(body.weight_dir);
    let real: string;
    try {
      real = fs.realpathSync(dir);
    } catch {
      throw new ApiError(400, `weight_dir: ${body.weight_dir} does not exist`, 'weight_dir', 'not_found');
    }
    const inside = allowedRoots.some((root) => {
      const r = fs.existsSync(root) ? fs.realpathSync(root) : root;
      return real === r || real.startsWith(r + path.sep);
    });
    if (!inside) {
      throw new ApiError(403, `weight_dir: ${body.weight_dir} is outside the allowed roots (${allowedRoots.join(', ')})`, 'weight_dir', 'forbidden_path', 'permission_error');
    }
    let loaded;
    try {
      loaded = loadHfModel(real);
    } catch (e) {
      throw new ApiError(400, `weight_dir: not a loadable model folder: ${(e as Error).message}`, 'weight_dir', 'invalid_model');
    }
    const mismatch = sameShape(base.config, loaded.config);
    if (mismatch) throw new ApiError(400, `weight_dir: not the same model shape: ${mismatch}`, 'weight_dir', 'shape_mismatch');
    const version = body.version ?? scheduler.policy.version + 1;
    await scheduler.updateWeights(loaded.tensors, { version, weightDir: real });
    return { status: 'ok', policy_version: version, weight_dir: real };
  });

  app.post('/reload_weights', async () => {
    await scheduler.updateWeights(base.tensors, { version: 0, weightDir: baseDir });
    return { status: 'ok', policy_version: 0, weight_dir: baseDir };
  });

  await app.listen({ host: config.server.host, port: config.server.port });
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : config.server.port;
  return {
    app,
    scheduler,
    url: `http://${config.server.host}:${port}`,
    close: async (graceMs = 30_000) => {
      closing = true;
      await scheduler.shutdown(graceMs);
      await app.close();
    },
  };
}
