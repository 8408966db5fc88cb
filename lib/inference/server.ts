/**
 * The policy server: an OpenAI-compatible HTTP API over the native engine with continuous batching
 * (scheduler.ts), plus the routes RL needs: token-in `/v1/generate`, `/update_weights`,
 * `/reload_weights`. Every response names the policy version that produced it (`policy_version`).
 *
 * Bad input never reaches the engine: bodies are validated (protocol.ts), prompts are checked
 * against the context and the vocabulary, and any error a client caused is a 4xx with an
 * OpenAI-style body naming the field. The sequences of one request are admitted all or none, so a
 * refused request (429) costs nothing. Long prompts are bounded cheaply before they are tokenized,
 * and tokenized off the event loop (tokenize.ts): no request stalls the others or `/health`.
 */
import { createHash, randomUUID, timingSafeEqual } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import * as native from '../../native';
import { ConfigError } from '../config/errors';
import type { InferenceConfig } from '../config/schemas';
import type { ArchConfig } from '../model/arch';
import { renderChat, type ChatMessage } from '../model/chat';
import { loadHfModel } from '../model/hf';
import { Tokenizer } from '../model/tokenizer';
import { EngineError, startSequences, type SequenceOptions, type SequenceResult } from './generation';
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
import { LimitError, QueueFullError, Scheduler, ShuttingDownError } from './scheduler';
import { PromptTokenizer } from './tokenize';

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

/**
 * The check of the `Authorization` header when `server.api_key_var` is set (undefined: no key).
 * An empty or unset variable is a configuration error, not a server without a key. Both sides are
 * hashed to equal-length digests and compared in constant time: the time taken says nothing about
 * how much of a guess was right.
 */
function bearerCheck(config: InferenceConfig): ((header: string | undefined) => boolean) | undefined {
  const name = config.server.api_key_var;
  if (name === undefined) return undefined;
  const key = process.env[name];
  if (!key) {
    throw new ConfigError(`server.api_key_var: the environment variable ${name} is ${key === undefined ? 'not set' : 'empty'}; export the bearer token clients must send in it, or leave server.api_key_var unset for a server without a key`);
  }
  const digest = (s: string) => createHash('sha256').update(s).digest();
  const expected = digest(`Bearer ${key}`);
  return (header) => timingSafeEqual(digest(header ?? ''), expected);
}

/** Is `real` (a resolved path) `root` or inside it? */
function within(root: string, real: string): boolean {
  const r = fs.existsSync(root) ? fs.realpathSync(root) : root;
  return real === r || real.startsWith(r.endsWith(path.sep) ? r : r + path.sep);
}

/** The engine on the base weights; the weights themselves are not kept in the JS heap (/reload_weights reads them again). */
async function loadBase(baseDir: string, config: InferenceConfig): Promise<{ arch: ArchConfig; model: native.NativeModel }> {
  const base = loadHfModel(baseDir);
  const model = await native.loadModel(base.config, base.tensors, { device: config.model.device, dtype: config.model.dtype });
  return { arch: base.config, model };
}

export async function startInferenceServer(config: InferenceConfig): Promise<InferenceServer> {
  // Settings are checked before the (slow) model load.
  const authorized = bearerCheck(config);
  native.setThreads(config.threads ?? os.cpus().length);
  const baseDir = path.resolve(config.model.name);
  const baseReal = fs.realpathSync(baseDir);
  const { arch, model } = await loadBase(baseDir, config);
  const tokenizer = Tokenizer.fromDir(baseDir);
  const prompts = new PromptTokenizer(tokenizer, baseDir);
  const contextLength = Math.min(config.seq_len, arch.maxPositionEmbeddings);
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
  const metrics = new InferenceMetrics(scheduler);
  let closing = false;

  const headersTimeout = config.server.headers_timeout_s * 1000;
  const requestTimeout = config.server.request_timeout_s * 1000;
  const app = Fastify({
    bodyLimit: BODY_LIMIT,
    logger: false,
    // A client must finish sending its headers, then its whole request, in bounded time (a
    // slowloris holds a socket forever otherwise: fastify's default requestTimeout of 0 also
    // switches off node's headersTimeout). Node checks these every connectionsCheckingInterval.
    requestTimeout,
    http: { headersTimeout, requestTimeout, connectionsCheckingInterval: Math.max(100, Math.min(5000, headersTimeout / 4)) },
  });

  app.setErrorHandler((error: Error & { statusCode?: number; code?: string }, _req, reply) => {
    if (error instanceof ApiError) return reply.status(error.status).send(error.body());
    if (error instanceof QueueFullError) return reply.status(429).send(new ApiError(429, error.message, null, 'queue_full', 'rate_limit_error').body());
    if (error instanceof LimitError) {
      const [param, code] = error.limit === 'kv_cache_tokens' ? ['max_tokens', 'kv_cache_exceeded'] : ['n', 'too_many_sequences'];
      return reply.status(400).send(new ApiError(400, `${param}: ${error.message}`, param, code).body());
    }
    if (error instanceof EngineError) return reply.status(500).send(engineErrorBody(error));
    if (error instanceof ShuttingDownError) return reply.status(503).send(new ApiError(503, error.message, null, 'shutting_down', 'server_error').body());
    const status = error.statusCode && error.statusCode >= 400 && error.statusCode < 500 ? error.statusCode : 500;
    const message = status === 500 ? `internal error: ${error.message}` : error.message;
    return reply.status(status).send(new ApiError(status, message, null, error.code ?? null, status === 500 ? 'server_error' : 'invalid_request_error').body());
  });
  app.setNotFoundHandler((req, reply) => {
    reply.status(404).send(new ApiError(404, `no route ${req.method} ${req.url}`).body());
  });
  // onRequest runs before the body is read or parsed: an unauthenticated client costs nothing.
  app.addHook('onRequest', async (req) => {
    if (closing) throw new ShuttingDownError('server is shutting down');
    if (authorized && req.url !== '/health' && !authorized(req.headers.authorization)) {
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
  const contextExceeded = (param: string, what: string) =>
    new ApiError(400, `${param}: the prompt has ${what} tokens; this model's context is ${contextLength} tokens`, param, 'context_length_exceeded');
  const checkPrompt = (ids: readonly number[], param: string) => {
    const bad = ids.findIndex((t) => t >= arch.vocabSize);
    if (bad >= 0) throw new ApiError(400, `${param}: token id ${ids[bad]} at index ${bad} is outside the vocabulary (size ${arch.vocabSize})`, param, 'invalid_token_id');
    if (ids.length >= contextLength) throw contextExceeded(param, String(ids.length));
  };
  /** Refuses, without tokenizing, a text whose token count cannot be below the context. */
  const checkTextLength = (text: string, param: string) => {
    const atLeast = tokenizer.minTokens(text);
    if (atLeast >= contextLength) throw contextExceeded(param, `at least ${atLeast}`);
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
  /** The body of a request that failed in the engine: what broke and, for broken weights, how to repair it. */
  const engineErrorBody = (e: EngineError) => {
    const served = `policy version ${scheduler.policy.version}, weights ${scheduler.policy.weightDir}`;
    const message =
      e.code === 'non_finite_logits'
        ? `${e.message} (${served}); load good weights with POST /update_weights or /reload_weights`
        : `${e.message} (${served})`;
    return new ApiError(500, message, null, e.code, 'server_error').body();
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
  /** Queues every sequence of a request, all or none (throws 429 / 400 / 503 before anything runs). */
  const start = (requests: ReturnType<typeof engineRequest>[], opts: SequenceOptions) => startSequences(scheduler, requests, opts);
  const usage = (promptTokens: number, results: SequenceResult[]) => {
    const completion = results.reduce((a, r) => a + r.tokenIds.length, 0);
    return { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion };
  };
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

  /** The chat rendered by the model's template and tokenized (off the event loop when long). */
  const chatPrompt = async (body: ChatCompletionRequest): Promise<number[]> => {
    const messages: ChatMessage[] = body.messages.map((m) => ({
      ...m,
      role: m.role === 'developer' ? 'system' : m.role,
      content: contentText(m),
      reasoning_content: m.reasoning_content ?? undefined,
      tool_calls: m.tool_calls as ChatMessage['tool_calls'],
    }));
    let text: string;
    try {
      text = renderChat(tokenizer, messages, {
        tools: body.tools ?? undefined,
        addGenerationPrompt: body.add_generation_prompt ?? true,
        extra: body.chat_template_kwargs ?? undefined,
      });
    } catch (e) {
      throw new ApiError(400, `messages: the chat template cannot render them: ${(e as Error).message}`, 'messages', 'invalid_messages');
    }
    checkTextLength(text, 'messages');
    return prompts.encode(text);
  };

  /** Server-sent events for a streaming response. It always ends: with [DONE], after an error event when it failed. */
  const startStream = (reply: FastifyReply, signal: AbortSignal) => {
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
    // Watched from the start: a client that leaves while its prompt is tokenized runs nothing.
    const signal = disconnectSignal(reply);
    const promptIds = await chatPrompt(body);
    checkPrompt(promptIds, 'messages');
    const maxParam = body.max_completion_tokens !== undefined && body.max_completion_tokens !== null ? 'max_completion_tokens' : 'max_tokens';
    const maxTokens = maxTokensFor(promptIds.length, body.max_completion_tokens ?? body.max_tokens, maxParam);
    const n = body.n ?? 1;
    const id = `chatcmpl-${randomUUID()}`;
    const created = now();
    const stopStrings = stopList(body.stop);
    const withTools = (body.tools?.length ?? 0) > 0;
    const requests = Array.from({ length: n }, (_, i) => engineRequest(promptIds, body, maxTokens, i, false, body.logprobs ? body.top_logprobs ?? 0 : 0));

    if (body.stream) {
      const chunk = (index: number, delta: object, extra: object = {}) => ({
        id, object: 'chat.completion.chunk', created, model: modelName, policy_version: scheduler.policy.version,
        choices: [{ index, delta, logprobs: null, finish_reason: null, ...extra }],
      });
      // Queued before any header is sent: a refused request is a plain 429/400, not a broken stream.
      // No token can arrive before the stream below exists (tokens come from a later decode step).
      const done = start(requests, {
        tokenizer, stopStrings, signal,
        onText: (i, delta, tokenId, logprob, top) => {
          const lp = body.logprobs ? { content: [logprobEntry(tokenId, logprob, top)] } : null;
          stream.send(chunk(i, { content: delta }, { logprobs: lp }));
        },
      });
      const stream = startStream(reply, signal);
      try {
        for (let i = 0; i < n; i++) stream.send(chunk(i, { role: 'assistant', content: '' }));
        const results = await done;
        if (signal.aborted) return;
        results.forEach((r, i) => stream.send(chunk(i, {}, { finish_reason: r.finishReason, ...(body.return_token_ids ? { token_ids: r.tokenIds } : {}) })));
        if (body.stream_options?.include_usage) {
          stream.send({ id, object: 'chat.completion.chunk', created, model: modelName, choices: [], usage: usage(promptIds.length, results) });
        }
      } catch (e) {
        // Headers are out: the error travels as an event, as OpenAI and vLLM send it.
        stream.send(e instanceof EngineError ? engineErrorBody(e) : new ApiError(500, `internal error: ${(e as Error).message}`, null, null, 'server_error').body());
      } finally {
        stream.end();
      }
      return;
    }

    const results = await start(requests, { tokenizer, stopStrings, signal });
    return {
      id, object: 'chat.completion', created, model: modelName,
      policy_version: Math.min(...results.map((r) => r.policyVersion)),
      choices: results.map((r, index) => {
        const { content, calls } = withTools ? parseToolCalls(r.text) : { content: r.text, calls: [] };
        return {
          index,
          message: { role: 'assistant', content: calls.length && !content ? null : content, ...(calls.length ? { tool_calls: calls } : {}) },
          logprobs: body.logprobs ? { content: tokenLogprobs(r) } : null,
          finish_reason: calls.length ? 'tool_calls' : r.finishReason,
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
    const signal = disconnectSignal(reply);
    const prompt = body.prompt;
    let promptIds: number[][];
    if (typeof prompt === 'string' || prompt.every((p) => typeof p === 'string')) {
      const texts = typeof prompt === 'string' ? [prompt] : (prompt as string[]);
      // Every text is bounded before any is tokenized.
      texts.forEach((t) => checkTextLength(t, 'prompt'));
      promptIds = await Promise.all(texts.map((t) => prompts.encode(t)));
    } else {
      promptIds = prompt.every((p) => typeof p === 'number') ? [prompt as number[]] : (prompt as number[][]);
    }
    promptIds.forEach((p) => {
      if (p.length === 0) throw new ApiError(400, 'prompt: empty prompt', 'prompt');
      checkPrompt(p, 'prompt');
    });
    const n = body.n ?? 1;
    const stopStrings = stopList(body.stop);
    const requests = promptIds.flatMap((p) => {
      const maxTokens = maxTokensFor(p.length, body.max_tokens ?? 16, 'max_tokens');
      return Array.from({ length: n }, (_, i) => engineRequest(p, body, maxTokens, i, false, body.logprobs ?? 0));
    });
    const results = await start(requests, { tokenizer, stopStrings, signal });
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
        finish_reason: r.finishReason,
        ...(body.return_token_ids ? { token_ids: r.tokenIds, prompt_token_ids: promptIds[Math.floor(index / n)] } : {}),
      })),
      usage: usage(promptIds.reduce((a, p) => a + p.length * n, 0), results),
    };
  });

  app.post('/v1/generate', async (req, reply) => {
    const body = parseBody(generateRequest, req.body);
    checkModel(body.model);
    checkPrompt(body.prompt_token_ids, 'prompt_token_ids');
    const maxTokens = maxTokensFor(body.prompt_token_ids.length, body.max_tokens, 'max_tokens');
    const signal = disconnectSignal(reply);
    const sampling = { ...body, stop_token_ids: body.stop_token_ids ?? null };
    const results = await start(
      Array.from({ length: body.n }, (_, i) => engineRequest(body.prompt_token_ids, sampling, maxTokens, i, body.prompt_logprobs && i === 0)),
      // Stop strings are matched in the decoded text, so only then does the sequence need a tokenizer.
      body.stop?.length ? { signal, tokenizer, stopStrings: body.stop } : { signal },
    );
    const promptLogprobs = results[0].promptLogprobs;
    return {
      id: `gen-${randomUUID()}`,
      model: modelName,
      policy_version: Math.min(...results.map((r) => r.policyVersion)),
      prompt_token_ids: body.prompt_token_ids,
      choices: results.map((r, index) => ({ index, token_ids: r.tokenIds, logprobs: r.logprobs, finish_reason: r.finishReason })),
      usage: usage(body.prompt_token_ids.length, results),
      prompt_logprobs: body.prompt_logprobs && promptLogprobs ? Array.from(promptLogprobs, (v, i) => (i === 0 ? null : v)) : null,
    };
  });

  /** Version label -> the folder (real path) it names, since start or the last /reload_weights. */
  const labels = new Map<number, string>([[0, baseReal]]);
  const insideRoots = (real: string) => allowedRoots.some((root) => within(root, real));
  const forbidden = (what: string) =>
    new ApiError(403, `weight_dir: ${what} outside the allowed roots (${allowedRoots.join(', ')})`, 'weight_dir', 'forbidden_path', 'permission_error');

  app.post('/update_weights', async (req) => {
    const body = parseBody(updateWeightsRequest, req.body);
    const dir = path.resolve(body.weight_dir);
    let real: string;
    try {
      real = fs.realpathSync(dir);
    } catch {
      throw new ApiError(400, `weight_dir: ${body.weight_dir} does not exist`, 'weight_dir', 'not_found');
    }
    if (!insideRoots(real)) throw forbidden(`${body.weight_dir} is`);
    if (!fs.statSync(real).isDirectory()) throw new ApiError(400, `weight_dir: ${body.weight_dir} is not a folder`, 'weight_dir', 'invalid_model');
    // Every file the load may read must be inside the roots too: a link in an allowed folder must
    // not make the server read a file elsewhere (nor quote it in an error).
    for (const name of fs.readdirSync(real)) {
      let target: string;
      try {
        target = fs.realpathSync(path.join(real, name));
      } catch {
        continue; // a dangling link: loading names the missing file
      }
      if (!insideRoots(target)) throw forbidden(`${path.join(body.weight_dir, name)} links to a file`);
    }
    // A version names one set of weights: clients skip loading when /health already shows the
    // version they want, so a wrong label silently serves wrong weights. 0 is the base model's,
    // and since start (or the last reload) a label stays with its folder and a folder with its
    // label. Labels may go down: rl evaluates step n, then samples with n - async_level.
    const version = body.version ?? scheduler.policy.version + 1;
    if (version === 0 && real !== baseReal) {
      throw new ApiError(400, `version: 0 is the base model's version (${baseDir}); ${body.weight_dir} needs a version >= 1`, 'version', 'invalid_version');
    }
    const labelled = labels.get(version);
    if (labelled !== undefined && labelled !== real) {
      throw new ApiError(409, `version: ${version} already names the weights in ${labelled}; ${body.weight_dir} needs its own version (or POST /reload_weights to start a new lineage)`, 'version', 'version_conflict');
    }
    const earlier = [...labels].find(([v, dir]) => dir === real && v !== version);
    if (earlier) {
      throw new ApiError(409, `version: ${body.weight_dir} was loaded as version ${earlier[0]}; the same weights cannot also be version ${version}`, 'version', 'version_conflict');
    }
    let loaded;
    try {
      loaded = loadHfModel(real);
    } catch (e) {
      throw new ApiError(400, `weight_dir: not a loadable model folder: ${(e as Error).message}`, 'weight_dir', 'invalid_model');
    }
    const mismatch = sameShape(arch, loaded.config);
    if (mismatch) throw new ApiError(400, `weight_dir: not the same model shape: ${mismatch}`, 'weight_dir', 'shape_mismatch');
    await scheduler.updateWeights(loaded.tensors, { version, weightDir: real });
    labels.set(version, real);
    return { status: 'ok', policy_version: version, weight_dir: real };
  });

  app.post('/reload_weights', async () => {
    let loaded;
    try {
      loaded = loadHfModel(baseDir);
    } catch (e) {
      throw new ApiError(500, `the base model folder ${baseDir} can no longer be loaded: ${(e as Error).message}`, null, 'base_model_unreadable', 'server_error');
    }
    const mismatch = sameShape(arch, loaded.config);
    if (mismatch) throw new ApiError(500, `the base model folder ${baseDir} changed shape since the server started: ${mismatch}`, null, 'base_model_changed', 'server_error');
    await scheduler.updateWeights(loaded.tensors, { version: 0, weightDir: baseDir });
    labels.clear();
    labels.set(0, baseReal);
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
      await prompts.close();
    },
  };
}
