/**
 * `POST /inference/v1/generate`: vLLM's token-in route as the `renderers` package's client calls it
 * (what a verifiers env server in train mode POSTs: lib/envs/verifiers/README.md). The request is
 * `{model, token_ids, sampling_params: {..., stop_token_ids, logprobs: 1, skip_special_tokens}}`,
 * the response `{request_id, choices: [{index, token_ids, logprobs: {content: [{token:
 * "token_id:<id>", logprob}]}, finish_reason}]}`: exactly one finite logprob per sampled token,
 * which the client checks. Like our other routes it names the policy version that sampled, which
 * that client drops: asked to, the route also keeps it by rollout (session-versions.ts).
 */
import { randomUUID } from 'node:crypto';
import * as path from 'node:path';
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { ApiError, parseBody, samplingFields, tokenId } from '../protocol';
import { LazyArray, sendJson } from './json-body';
import { disconnectSignal, usage, type Served } from './served';
import { RECORD_VERSIONS_HEADER, SESSION_HEADER, type SessionVersions } from './session-versions';

const absent = (what: string) =>
  z
    .unknown()
    .optional()
    .refine((v) => v === undefined || v === null, what);

const samplingParams = z.strictObject({
  ...samplingFields,
  max_tokens: z.number().int().min(1).nullish(),
  /** The sampled token's logprob is always returned; top alternatives are not (0 or 1 only). */
  logprobs: z.number().int().min(0).max(1).nullish(),
  // Text-side options: this route returns token ids only, so they change nothing.
  skip_special_tokens: z.boolean().nullish(),
  spaces_between_special_tokens: z.boolean().nullish(),
  include_stop_str_in_output: z.boolean().nullish(),
  // Where a bridged turn's new prompt tokens start, for the routed experts vLLM returns (the
  // renderers client sends it on every multi-turn continuation); this route returns no routes.
  routed_experts_prompt_start: z.number().int().min(0).nullish(),
});

export const rendererGenerateRequest = z.strictObject({
  model: z.string().optional(),
  token_ids: z.array(tokenId).min(1),
  sampling_params: samplingParams.default({}),
  /** Scheduling hints vLLM takes; this server has no prefix cache or priorities, so they change nothing. */
  cache_salt: z.string().nullish(),
  priority: z.number().int().nullish(),
  request_id: z.string().nullish(),
  return_token_ids: z.boolean().nullish(),
  features: absent('multimodal inputs (features) are not supported'),
  content_parts: absent('multimodal inputs (content_parts) are not supported'),
});

export function registerRendererGenerateRoute(
  app: FastifyInstance,
  served: Served,
  versions: SessionVersions,
  /** The served model's folder (a Hugging Face name's snapshot): verifiers may name the model by it. */
  modelDir: string,
): void {
  app.post('/inference/v1/generate', async (req, reply) => {
    const body = parseBody(rendererGenerateRequest, req.body);
    const sp = body.sampling_params;
    // verifiers names the model by the folder its renderer loads: the served folder, however spelt, is the served model.
    const folder = body.model === undefined ? undefined : path.resolve(body.model);
    if (folder === undefined || (folder !== path.resolve(served.modelName) && folder !== modelDir))
      served.checkModel(body.model);
    served.checkPrompt(body.token_ids, 'token_ids');
    const maxTokens = served.maxTokensFor(body.token_ids.length, sp.max_tokens, 'sampling_params.max_tokens');
    served.checkSampling(sp, maxTokens, 'sampling_params.');
    const stops = typeof sp.stop === 'string' ? [sp.stop] : (sp.stop ?? []);
    const signal = disconnectSignal(reply);
    const results = await served.start(
      Array.from({ length: sp.n ?? 1 }, (_, i) => served.engineRequest(body.token_ids, sp, maxTokens, i)),
      stops.length ? { signal, tokenizer: served.tokenizer, stopStrings: stops } : { signal },
    );
    for (const r of results) {
      const bad = r.logprobs.findIndex((v) => !Number.isFinite(v));
      // The engine samples only tokens of non-zero probability; a non-finite logprob is a bug, not input.
      if (r.logprobs.length !== r.tokenIds.length || bad >= 0)
        throw new ApiError(
          500,
          `the engine returned ${r.logprobs.length} logprobs for ${r.tokenIds.length} tokens` +
            (bad >= 0 ? ` (logprob ${r.logprobs[bad]} at index ${bad})` : ''),
          null,
          'engine_logprobs',
          'server_error',
        );
    }
    const session = req.headers[SESSION_HEADER];
    if (typeof session === 'string' && req.headers[RECORD_VERSIONS_HEADER] !== undefined)
      versions.record(
        session,
        results.map((r) => ({ token_ids: r.tokenIds, policy_versions: r.tokenPolicyVersions })),
      );
    return sendJson(reply, {
      request_id: body.request_id ?? `gen-${randomUUID()}`,
      model: served.modelName,
      policy_version: Math.min(...results.map((r) => r.policyVersion)),
      prompt_token_ids: body.token_ids,
      choices: results.map((r, index) => ({
        index,
        token_ids: r.tokenIds,
        logprobs: {
          content: new LazyArray(r.tokenIds.length, (k) => ({
            token: `token_id:${r.tokenIds[k]}`,
            logprob: r.logprobs[k],
          })),
        },
        finish_reason: r.finishReason,
        policy_version: r.policyVersion,
        policy_version_range: r.policyVersionRange,
      })),
      usage: usage(body.token_ids.length, results),
    });
  });
}
