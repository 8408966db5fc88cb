/**
 * The policy server: an OpenAI-compatible HTTP API over the native engine with continuous batching
 * (scheduler.ts), plus the routes RL needs: token-in `/v1/generate`, `/update_weights`,
 * `/reload_weights`. Every response names the policy version that produced it (`policy_version`).
 *
 * Bad input never reaches the engine: bodies are validated (protocol.ts), prompts are checked
 * against the context and the vocabulary (served.ts), and any error a client caused is a 4xx with
 * an OpenAI-style body naming the field (errors.ts). The sequences of one request are admitted all
 * or none, so a refused request (429) costs nothing. Long prompts are bounded cheaply before they
 * are tokenized, and chat templates rendered and prompts tokenized off the event loop, with time
 * and memory limits (prompts.ts): no request stalls the others or `/health`. Routes: openai-routes.ts, policy-routes.ts.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import Fastify, { type FastifyInstance } from 'fastify';
import * as native from '../../../native';
import { loadModel } from '../../model/engine';
import { ConfigError } from '../../failures';
import type { InferenceConfig } from '../../config/schemas';
import { resolveModelDir } from '../../hub';
import { loadHfModelAsync, type HfModel } from '../../model/hf';
import { Tokenizer } from '../../model/tokenizer';
import { InferenceMetrics } from '../metrics';
import { ApiError, checkBodyDepth } from '../protocol';
import { Scheduler, ShuttingDownError } from '../scheduler';
import { PromptWorkers } from '../prompts';
import { frameworkErrorOptions, installErrorHandlers } from './errors';
import { generatorOptionsOf, refusedKeyOf } from './generator-options';
import { registerOpenAiRoutes } from './openai-routes';
import { registerPolicyRoutes } from './policy-routes';
import { registerRendererGenerateRoute } from './renderer-generate';
import { BODY_LIMIT, Served } from './served';
import { registerSessionVersionsRoute, SessionVersions } from './session-versions';

/** Prompt helper processes: a template that runs to its time limit in one leaves the other to the rest. */
const PROMPT_PROCESSES = 2;

export interface InferenceServer {
  app: FastifyInstance;
  scheduler: Scheduler;
  /** Base URL once listening, e.g. http://127.0.0.1:8000 */
  url: string;
  /** Stops admitting, lets running requests finish (up to `graceMs`), closes the HTTP server. */
  close(graceMs?: number): Promise<void>;
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
    throw new ConfigError(
      `server.api_key_var: the environment variable ${name} is ${key === undefined ? 'not set' : 'empty'}; export the bearer token clients must send in it, or leave server.api_key_var unset for a server without a key`,
    );
  }
  const digest = (s: string) => createHash('sha256').update(s).digest();
  const expected = digest(`Bearer ${key}`);
  return (header) => timingSafeEqual(digest(header ?? ''), expected);
}

/**
 * The base model folder's tokenizer and weights, read and checked (config.json's sizes against its
 * files, the tensors against the config) before the engine allocates anything. What is wrong with
 * the folder is the user's to fix: a config error naming model.name (the CLI exits 2).
 */
async function readBase(baseDir: string): Promise<{ real: string; base: HfModel; tokenizer: Tokenizer }> {
  try {
    const real = fs.realpathSync(baseDir);
    const tokenizer = Tokenizer.fromDir(baseDir);
    // The path /reload_weights and /update_weights load by: one path, one check.
    return { real, base: await loadHfModelAsync(baseDir), tokenizer };
  } catch (e) {
    throw new ConfigError(`model.name: ${(e as Error).message}`);
  }
}

/** The engine on the base weights; they are not kept in the JS heap past this (/reload_weights reads them again). */
async function loadEngine(base: HfModel, config: InferenceConfig): Promise<native.NativeModel> {
  return loadModel(base.config, base.tensors, { device: config.model.device, dtype: config.model.dtype });
}

/** The engine's generator with the server's settings; what the device or build cannot honour is refused by its key. */
function createGenerator(model: native.NativeModel, config: InferenceConfig, contextLength: number): native.Generator {
  try {
    return model.createGenerator(generatorOptionsOf(config, contextLength));
  } catch (e) {
    if (native.isEngineOptionError(e)) {
      const refused = refusedKeyOf(e.option);
      if (refused) throw new ConfigError(`${refused.key}: ${e.reason}; ${refused.hint}`);
    }
    throw e;
  }
}

export async function startInferenceServer(config: InferenceConfig): Promise<InferenceServer> {
  // Settings are checked before the (slow) model load.
  const authorized = bearerCheck(config);
  native.setThreads(config.threads ?? os.cpus().length);
  // Requests of every batch size and prompt length free blocks of many sizes: kept up to this bound.
  native.setCpuCache(config.cpu_cache_mb * 2 ** 20);
  const baseDir = resolveModelDir(config.model.name);
  const { real: baseReal, base, tokenizer } = await readBase(baseDir);
  const arch = base.config;
  // Before the engine loads (see prompt-supervisor.ts); a later restart waits for a pause between
  // engine steps.
  let scheduler: Scheduler | undefined;
  const prompts = new PromptWorkers(
    tokenizer,
    baseDir,
    {
      processes: PROMPT_PROCESSES,
      timeoutMs: config.server.prompt_timeout_s * 1000,
      heapMb: config.server.prompt_heap_mb,
    },
    (start) => (scheduler ? scheduler.betweenSteps(start) : Promise.resolve(start())),
  );
  const contextLength = Math.min(config.seq_len, arch.maxPositionEmbeddings);
  let model: native.NativeModel;
  let generator: native.Generator;
  try {
    model = await loadEngine(base, config);
    generator = createGenerator(model, config, contextLength);
  } catch (e) {
    await prompts.close();
    throw e;
  }
  scheduler = new Scheduler(
    model,
    generator,
    {
      maxRunning: config.max_running,
      maxQueued: config.max_queued,
      kvCacheTokens: config.kv_cache_tokens,
      decodeSteps: config.decode_steps,
    },
    { version: 0, weightDir: baseDir },
  );
  const modelName = config.model.name;
  const allowedRoots = (config.allowed_weight_roots ?? [config.output_dir]).map((r) => path.resolve(r));
  const metrics = new InferenceMetrics(scheduler);
  const served = new Served(
    scheduler,
    tokenizer,
    prompts,
    arch,
    contextLength,
    modelName,
    config.server.max_response_entries,
  );
  let closing = false;

  const headersTimeout = config.server.headers_timeout_s * 1000;
  const requestTimeout = config.server.request_timeout_s * 1000;
  const app = Fastify({
    bodyLimit: BODY_LIMIT,
    logger: false,
    ...frameworkErrorOptions,
    // A client must finish sending its headers, then its whole request, in bounded time (a
    // slowloris holds a socket forever otherwise: fastify's default requestTimeout of 0 also
    // switches off node's headersTimeout). Node checks these every connectionsCheckingInterval.
    requestTimeout,
    http: {
      headersTimeout,
      requestTimeout,
      requireHostHeader: false, // checked in installErrorHandlers, answered OpenAI-style

      connectionsCheckingInterval: Math.max(100, Math.min(5000, headersTimeout / 4)),
    },
  });

  installErrorHandlers(app, scheduler);
  // onRequest runs before the body is read or parsed: an unauthenticated client costs nothing.
  app.addHook('onRequest', async (req) => {
    if (closing) throw new ShuttingDownError('server is shutting down');
    if (authorized && req.url !== '/health' && !authorized(req.headers.authorization)) {
      throw new ApiError(401, 'missing or invalid API key (Authorization: Bearer <key>)', null, 'invalid_api_key');
    }
  });
  // Once the body is parsed, before any route reads it (protocol.ts).
  app.addHook('preValidation', async (req) => checkBodyDepth(req.body));
  app.addHook('onResponse', async (req, reply) =>
    metrics.countRequest(req.routeOptions.url ?? 'unknown', reply.statusCode),
  );
  app.addHook('onSend', async (_req, reply) => {
    reply.header('x-policy-version', String(scheduler.policy.version));
  });

  app.get('/health', async () => ({
    status: 'ok',
    policy_version: scheduler.policy.version,
    weight_dir: scheduler.policy.weightDir,
  }));

  app.get('/metrics', async (_req, reply) => {
    reply.header('content-type', metrics.registry.contentType);
    return metrics.registry.metrics();
  });

  registerOpenAiRoutes(app, served);
  registerPolicyRoutes(app, served, {
    baseDir,
    baseReal,
    allowedRoots,
    onWeightUpdate: (source) => metrics.countWeightUpdate(source),
  });
  const sessionVersions = new SessionVersions();
  registerRendererGenerateRoute(app, served, sessionVersions, baseDir);
  registerSessionVersionsRoute(app, sessionVersions);

  try {
    await app.listen({ host: config.server.host, port: config.server.port });
  } catch (e) {
    await prompts.close();
    throw e;
  }
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
