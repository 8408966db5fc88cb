/**
 * Request bodies of the inference server's routes, as zod schemas, and the OpenAI error format.
 * Fields the OpenAI API defines but we do not implement are rejected when set to anything but
 * their neutral value, so a client never silently gets different sampling than it asked for.
 */
import { z } from 'zod';
import { describeDeepPath, MAX_JSON_DEPTH, pathTooDeep } from '../json';

/** An HTTP error with an OpenAI-style body: `{error: {message, type, param, code}}`. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
    readonly type: string = status === 401
      ? 'authentication_error'
      : status === 404
        ? 'not_found_error'
        : 'invalid_request_error',
  ) {
    super(message);
  }
  body() {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

/** The first zod issue as an ApiError naming the field. */
export function fromZodError(error: z.ZodError): ApiError {
  const issue = error.issues[0];
  const param = issue.path.join('.') || null;
  const what =
    issue.code === 'unrecognized_keys'
      ? `unknown field(s) ${issue.keys.join(', ')}`
      : issue.code === 'invalid_key'
        ? (issue.issues[0]?.message ?? issue.message) // what is wrong with the key, not just "Invalid key"
        : issue.message;
  return new ApiError(400, param ? `${param}: ${what}` : what, param, 'invalid_value');
}

/**
 * Refuses a body nested deeper than MAX_JSON_DEPTH, naming the field, before any route reads it:
 * what a route hands on (a chat to the prompt helpers, by structured clone over IPC; a template's
 * loops) must not recurse without bound.
 */
export function checkBodyDepth(body: unknown): void {
  const keys = pathTooDeep(body);
  if (!keys) return;
  const field = describeDeepPath(keys);
  throw new ApiError(
    400,
    `${field}: nests deeper than ${MAX_JSON_DEPTH} levels (objects and arrays inside each other), more than a request may`,
    keys.slice(0, 6).join('.'),
    'too_deep',
  );
}

/** Parses a body or throws a 400 naming the offending field. */
export function parseBody<S extends z.ZodType>(schema: S, body: unknown): z.output<S> {
  if (body === undefined || body === null || typeof body !== 'object' || Array.isArray(body)) {
    throw new ApiError(400, 'request body must be a JSON object', null, 'invalid_body');
  }
  const r = schema.safeParse(body);
  if (!r.success) throw fromZodError(r.error);
  return r.data;
}

export const tokenId = z.number().int().nonnegative();
/** A field accepted only at its neutral value (so nobody silently gets other sampling). */
export const neutral = <T extends z.ZodType>(schema: T, value: unknown, what: string) =>
  schema.optional().refine((v) => v === undefined || v === null || v === value, `${what} is not supported`);

/**
 * OpenAI's `logit_bias`: token ids (as the keys of a JSON object) to a bias in [-100, 100] added
 * to their logits before sampling (the ids are checked against the vocabulary: served.ts).
 */
const logitBias = z.record(
  z.string().regex(/^(0|[1-9]\d{0,9})$/, 'logit_bias keys are token ids (integers, as strings)'),
  z.number().min(-100).max(100),
);

/** The sampling fields every generation route takes, vLLM's `/inference/v1/generate` included. */
export const samplingFields = {
  temperature: z.number().min(0).max(100).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
  top_k: z.number().int().min(-1).nullish(),
  min_p: z.number().min(0).max(1).nullish(),
  seed: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).nullish(),
  n: z.number().int().min(1).max(64).nullish(),
  stop: z.union([z.string().min(1), z.array(z.string().min(1)).max(16)]).nullish(),
  stop_token_ids: z.array(tokenId).max(64).nullish(),
  ignore_eos: z.boolean().nullish(),
  /** The stop tokens and strings end nothing before this many tokens (vLLM's). */
  min_tokens: z.number().int().min(0).nullish(),
  /** OpenAI's penalties on the tokens sampled so far (the prompt's not counted), in [-2, 2]. */
  frequency_penalty: z.number().min(-2).max(2).nullish(),
  presence_penalty: z.number().min(-2).max(2).nullish(),
  logit_bias: logitBias.nullish(),
  repetition_penalty: neutral(z.number().nullable(), 1, 'repetition_penalty other than 1'),
};

/** Sampling fields shared by the OpenAI-style routes (OpenAI names plus vLLM's extensions). */
const sampling = {
  ...samplingFields,
  user: z.string().nullish(),
  /** vLLM extension: return prompt and completion token ids. */
  return_token_ids: z.boolean().nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish() }).nullish(),
};

/**
 * A message's content part: text. The engine runs text models (a multimodal checkpoint's vision
 * tower is not loaded), so an image, audio or video part is refused by its type, never dropped.
 */
const contentPart = z
  .looseObject({ type: z.string(), text: z.unknown().optional() })
  .superRefine((p, ctx) => {
    if (p.type !== 'text')
      ctx.addIssue({
        code: 'custom',
        path: ['type'],
        message: `content part type '${p.type}' is not supported: this server runs a text model (no image, audio or video input)`,
      });
    else if (typeof p.text !== 'string') ctx.addIssue({ code: 'custom', path: ['text'], message: 'must be a string' });
  })
  .transform((p) => ({ ...p, type: 'text' as const, text: p.text as string }));

const message = z.looseObject({
  role: z.enum(['system', 'developer', 'user', 'assistant', 'tool']),
  content: z.union([z.string(), z.array(contentPart)]).nullish(),
  name: z.string().optional(),
  tool_calls: z.array(z.unknown()).optional(),
  tool_call_id: z.string().optional(),
  reasoning_content: z.string().nullish(),
});
export type RequestMessage = z.output<typeof message>;

export const chatCompletionRequest = z.looseObject({
  model: z.string().optional(),
  messages: z.array(message).min(1),
  max_tokens: z.number().int().min(1).nullish(),
  max_completion_tokens: z.number().int().min(1).nullish(),
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int().min(0).max(20).nullish(),
  tools: z
    .array(z.looseObject({ type: z.literal('function'), function: z.looseObject({ name: z.string() }) }))
    .nullish(),
  tool_choice: z.unknown().optional(),
  add_generation_prompt: z.boolean().nullish(),
  chat_template_kwargs: z.record(z.string(), z.unknown()).nullish(),
  ...sampling,
});
export type ChatCompletionRequest = z.output<typeof chatCompletionRequest>;

export const completionRequest = z.looseObject({
  model: z.string().optional(),
  prompt: z.union([
    z.string(),
    z.array(z.string()).min(1).max(64),
    z.array(tokenId).min(1),
    z.array(z.array(tokenId).min(1)).min(1).max(64),
  ]),
  /** 0 only with `echo`: the prompt and its logprobs, nothing generated. */
  max_tokens: z.number().int().min(0).nullish(),
  logprobs: z.number().int().min(0).max(20).nullish(),
  /** The prompt comes first in `text` and, with `logprobs`, in every logprobs list (its first token's logprob: null). */
  echo: z.boolean().nullish(),
  suffix: neutral(z.string().nullable(), null, 'suffix'),
  best_of: z.number().int().min(1).max(1).nullish(),
  ...sampling,
});
export type CompletionRequest = z.output<typeof completionRequest>;

/** Token in, token out: what the orchestrator's rollouts use. */
export const generateRequest = z.strictObject({
  model: z.string().optional(),
  prompt_token_ids: z.array(tokenId).min(1),
  max_tokens: z.number().int().min(1).optional(),
  temperature: z.number().min(0).max(100).default(1),
  top_p: z.number().gt(0).max(1).default(1),
  top_k: z.number().int().min(-1).default(-1),
  min_p: z.number().min(0).max(1).default(0),
  seed: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).optional(),
  n: z.number().int().min(1).max(64).default(1),
  stop_token_ids: z.array(tokenId).max(64).optional(),
  /** Stop strings: the sequence ends at the token whose text completes one (that token is kept). */
  stop: z.array(z.string().min(1)).max(16).optional(),
  ignore_eos: z.boolean().default(false),
  min_tokens: samplingFields.min_tokens,
  frequency_penalty: samplingFields.frequency_penalty,
  presence_penalty: samplingFields.presence_penalty,
  logit_bias: samplingFields.logit_bias,
  prompt_logprobs: z.boolean().default(false),
  /**
   * MoE models (router replay): with every choice, `routes[t]` = the experts (sparse layers x
   * experts per token, flattened) of the token fed to sample token t, and `prompt_routes` for
   * prompt tokens 0..P-2.
   */
  return_routes: z.boolean().default(false),
});
export type GenerateRequest = z.output<typeof generateRequest>;

/**
 * `/weights/join` (weight_broadcast nccl, sent by trainer rank 0): become rank `rank` of `size` of
 * the process group generation `generation`, on the trainer's store at `store` (host:port).
 */
export const weightsJoinRequest = z.strictObject({
  generation: z.string().regex(/^[A-Za-z0-9._-]{1,64}$/),
  store: z.string().regex(/^[^\s/]+:\d{1,5}$/, 'host:port'),
  rank: z.number().int().positive(),
  size: z.number().int().min(2).max(65536),
  timeout_s: z.number().positive(),
  /** Where the received bytes go through: cpu (Gloo) or a CUDA device (NCCL). */
  device: z.string().regex(/^(cpu|cuda(:\d+)?)$/),
});

/**
 * `/weights/receive`: take version `version` (to be loaded as `weight_dir`) from the group, unit by
 * unit as the trainer sends them; answered once all of it is here.
 */
export const weightsReceiveRequest = z.strictObject({
  generation: z.string().min(1).max(64),
  version: z.number().int().positive(),
  weight_dir: z.string().min(1),
  units: z
    .array(
      z.array(
        z.strictObject({
          name: z.string().min(1).max(512),
          dtype: z.enum(['F32', 'BF16', 'F16']),
          shape: z.array(z.number().int().nonnegative()).max(8),
        }),
      ),
    )
    .min(1),
  bucket_bytes: z.number().int().positive(),
});

export const updateWeightsRequest = z.strictObject({
  weight_dir: z.string().min(1),
  /**
   * The policy version these weights are (the trainer step); default: the current version + 1.
   * 0 is the base model's (400 for other weights); a version already naming other weights, or
   * weights already loaded under another version, is a 409 (until /reload_weights).
   */
  version: z.number().int().nonnegative().optional(),
});
