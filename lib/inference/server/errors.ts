/**
 * Every error a request can end with, as an OpenAI-style body (protocol.ts `ApiError`): a client's
 * mistake is a 4xx naming the field, a full queue 429, shutting down 503, a failure in the engine
 * 500 saying which weights were served.
 */
import * as http from 'node:http';
import type { Socket } from 'node:net';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
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

/** The bytes of a complete response with `error`'s body, for a socket no request object owns; the connection closes. */
function rawResponse(error: ApiError): string {
  const body = JSON.stringify(error.body());
  return (
    `HTTP/1.1 ${error.status} ${http.STATUS_CODES[error.status]}\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`
  );
}

/**
 * What Node's HTTP parser refused before any route saw the request (a malformed request line or
 * header, headers over the limit, a client too slow to send them), as an OpenAI-style error: the
 * reason is llhttp's fixed text, never the client's bytes.
 */
function clientError(err: Error & { code?: string; reason?: string }): ApiError {
  if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT')
    return new ApiError(
      408,
      'the request was not received in time (server.headers_timeout_s for its headers, server.request_timeout_s for all of it)',
      null,
      'request_timeout',
    );
  if (err.code === 'HPE_HEADER_OVERFLOW')
    return new ApiError(
      431,
      `the request line and headers exceed ${http.maxHeaderSize} bytes`,
      null,
      'request_header_fields_too_large',
    );
  const why =
    err.code === 'HPE_INVALID_METHOD' ? 'unknown HTTP method' : (err.reason ?? err.code ?? 'cannot be parsed');
  return new ApiError(400, `malformed HTTP request: ${why}`, null, 'invalid_http_request');
}

/**
 * Fastify options that make the errors the framework and Node answer themselves OpenAI-style, like
 * every other error of the server: `clientErrorHandler` (the HTTP parser's refusals) and
 * `frameworkErrors` (a URL that cannot be decoded).
 */
export const frameworkErrorOptions = {
  clientErrorHandler(err: Error, socket: Socket): void {
    if ((err as NodeJS.ErrnoException).code === 'ECONNRESET' || socket.destroyed) return;
    if (socket.writable) socket.write(rawResponse(clientError(err)));
    socket.destroy(err);
  },
  frameworkErrors(error: Error & { code?: string }, _req: FastifyRequest, reply: FastifyReply): void {
    const bad = error.code === 'FST_ERR_BAD_URL';
    const e = bad
      ? new ApiError(400, 'the URL cannot be decoded (malformed percent-encoding)', null, 'invalid_url')
      : new ApiError(400, error.message, null, 'invalid_http_request');
    void reply.status(e.status).send(e.body());
  },
};

/**
 * Node answers some requests before Fastify sees them: an `Expect` header it cannot honour (417),
 * a CONNECT (it would drop the connection silently). Both get an OpenAI-style body here.
 */
function installProtocolHandlers(server: http.Server): void {
  server.on('checkExpectation', (req: http.IncomingMessage, res: http.ServerResponse) => {
    const body = new ApiError(
      417,
      `Expect: ${String(req.headers.expect).slice(0, 64)} is not supported (only 100-continue)`,
      null,
      'expectation_failed',
    ).body();
    const text = JSON.stringify(body);
    res
      .writeHead(417, {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(text),
        connection: 'close',
      })
      .end(text);
  });
  server.on('connect', (_req: http.IncomingMessage, socket: Socket) => {
    socket.end(
      rawResponse(new ApiError(405, 'CONNECT is not supported: this is not a proxy', null, 'method_not_allowed')),
    );
  });
}

/** The error and not-found handlers of the server. */
export function installErrorHandlers(app: FastifyInstance, scheduler: Scheduler): void {
  installProtocolHandlers(app.server);
  // Node's own check answers a missing Host with an empty 400; this one says what is missing.
  app.addHook('onRequest', async (req) => {
    if (req.raw.httpVersion === '1.1' && req.headers.host === undefined)
      throw new ApiError(400, 'an HTTP/1.1 request needs a Host header', null, 'invalid_http_request');
  });
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
