/**
 * Every error a request can end with, as an OpenAI-style body (protocol.ts `ApiError`): a client's
 * mistake is a 4xx naming the field, a full queue 429, shutting down 503, a failure in the engine
 * 500 saying which weights were served.
 */
import type { FastifyInstance } from 'fastify';
import { EngineError } from '../generation';
import { ApiError } from '../protocol';
import { LimitError, QueueFullError, type Scheduler, ShuttingDownError } from '../scheduler';

/** The body of a request that failed in the engine: what broke and, for broken weights, how to repair it. */
export function engineErrorBody(e: EngineError, scheduler: Scheduler) {
  const served = `policy version ${scheduler.policy.version}, weights ${scheduler.policy.weightDir}`;
  const message =
    e.code === 'non_finite_logits'
      ? `${e.message} (${served}); load good weights with POST /update_weights or /reload_weights`
      : `${e.message} (${served})`;
  return new ApiError(500, message, null, e.code, 'server_error').body();
}

/** The error and not-found handlers of the server. */
export function installErrorHandlers(app: FastifyInstance, scheduler: Scheduler): void {
  app.setErrorHandler((error: Error & { statusCode?: number; code?: string }, _req, reply) => {
    if (error instanceof ApiError) return reply.status(error.status).send(error.body());
    if (error instanceof QueueFullError)
      return reply.status(429).send(new ApiError(429, error.message, null, 'queue_full', 'rate_limit_error').body());
    if (error instanceof LimitError) {
      const [param, code] =
        error.limit === 'kv_cache_tokens' ? ['max_tokens', 'kv_cache_exceeded'] : ['n', 'too_many_sequences'];
      return reply.status(400).send(new ApiError(400, `${param}: ${error.message}`, param, code).body());
    }
    if (error instanceof EngineError) return reply.status(500).send(engineErrorBody(error, scheduler));
    if (error instanceof ShuttingDownError)
      return reply.status(503).send(new ApiError(503, error.message, null, 'shutting_down', 'server_error').body());
    const status = error.statusCode && error.statusCode >= 400 && error.statusCode < 500 ? error.statusCode : 500;
    const message = status === 500 ? `internal error: ${error.message}` : error.message;
    return reply
      .status(status)
      .send(
        new ApiError(
          status,
          message,
          null,
          error.code ?? null,
          status === 500 ? 'server_error' : 'invalid_request_error',
        ).body(),
      );
  });
  app.setNotFoundHandler((req, reply) => {
    reply.status(404).send(new ApiError(404, `no route ${req.method} ${req.url}`).body());
  });
}
