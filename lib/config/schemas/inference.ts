/** [inference] and its [server]: the served model, the HTTP server and the engine's scheduler. */
import { z } from 'zod';
import { GENERATOR_DEFAULTS, PREFIX_SHARINGS } from '../../../native/engine-types.generated';
import { outputDir, positiveInt, section, seed, seqLen, threads } from './common';
import { generatorOptionKeys } from './engine-options';
import { modelFields } from './model';

/** The served model (inference): the engine's settings plus how decode steps run. */
const inferenceModelSchema = () =>
  section({
    ...modelFields(),
    enforce_eager: z
      .boolean()
      .default(!GENERATOR_DEFAULTS.cudaGraphs)
      .describe(
        'decode every step op by op; false: on CUDA, dense models replay decode steps from CUDA graphs (one per batch and context-length bucket, captured on first use), as vLLM does',
      )
      .register(generatorOptionKeys, { option: 'cudaGraphs', invert: true }),
    paged_attention_kernel: z
      .boolean()
      .default(GENERATOR_DEFAULTS.pagedAttentionKernel)
      .describe(
        "CUDA: decode attention through the engine's own kernel (flash-decoding over the KV blocks in place) instead of libtorch's matmuls over gathered blocks; refused on the CPU and by a build without it",
      )
      .register(generatorOptionKeys, { option: 'pagedAttentionKernel', refusedHint: 'leave it false' }),
  });

export const serverSchema = z
  .strictObject({
    host: z.string().default('127.0.0.1').describe('interface the HTTP server binds'),
    port: z.number().int().min(0).max(65535).default(8000).describe('HTTP port (0 = any free port)'),
    api_key_var: z
      .string()
      .min(1)
      .optional()
      .describe(
        'environment variable holding the bearer token clients must send (in rl, the orchestrator sends it too: set it for the cpu workers as well)',
      ),
    headers_timeout_s: z
      .number()
      .positive()
      .default(30)
      .describe('a client that has not sent its request headers after this long is disconnected (408)'),
    request_timeout_s: z
      .number()
      .positive()
      .default(300)
      .describe(
        'a client that has not sent its whole request (headers and body) after this long is disconnected (408)',
      ),
    prompt_timeout_s: z
      .number()
      .positive()
      .default(30)
      .describe(
        "longest the model's chat template may render, and its tokenizer tokenize, one request's prompt (in a helper process); beyond it the helper is stopped and the request gets a 400 naming the template",
      ),
    max_response_entries: positiveInt()
      .default(1 << 20)
      .describe(
        'largest non-streamed completion one request may ask for, in entries: n x max_tokens x (1 + top logprobs) on /v1/chat/completions, prompts x n x (max_tokens x (1 + logprobs) + echoed prompt tokens) on /v1/completions; more is a 400 naming the fields (a stream is not bounded)',
      ),
    prompt_heap_mb: positiveInt()
      .default(1024)
      .describe(
        'heap of each helper process that renders chat templates and tokenizes prompts, in MiB; a template or tokenizer that needs more is stopped and the request gets a 400 naming it',
      ),
  })
  .superRefine((c, ctx) => {
    if (c.request_timeout_s < c.headers_timeout_s) {
      ctx.addIssue({
        code: 'custom',
        path: ['request_timeout_s'],
        message: `must be at least headers_timeout_s (${c.headers_timeout_s}): the request includes its headers`,
      });
    }
  })
  .prefault({});

export const inferenceSchema = z
  .strictObject({
    model: inferenceModelSchema(),
    seq_len: seqLen(),
    output_dir: outputDir(),
    seed: seed(),
    threads: threads(),
    server: serverSchema,
    max_running: positiveInt()
      .default(64)
      .describe('max sequences decoded together')
      .register(generatorOptionKeys, { option: 'maxSequences' }),
    max_queued: positiveInt()
      .default(1024)
      .describe(
        'max sequences waiting for a slot before new requests get 429 (in rl, the orchestrator keeps at most max_running + max_queued requests in flight per server, and retries a 429 with backoff)',
      ),
    kv_cache_tokens: positiveInt()
      .optional()
      .describe(
        'the paged KV cache in token positions (rounded up to whole blocks), at least seq_len; unset = gpu_memory_utilization on CUDA when set, else max_running x seq_len',
      )
      .register(generatorOptionKeys, { option: 'kvCacheTokens' }),
    gpu_memory_utilization: z
      .number()
      .gt(0)
      .lte(1)
      .optional()
      .describe(
        "CUDA, instead of kv_cache_tokens: the share of the device's memory the server uses at most (weights, a step's activations, then the KV cache), as vLLM's",
      )
      .register(generatorOptionKeys, {
        option: 'gpuMemoryUtilization',
        refusedHint: 'raise it, or set kv_cache_tokens',
      }),
    block_size: positiveInt()
      .max(1024)
      .default(GENERATOR_DEFAULTS.blockSize)
      .describe('token positions per KV-cache block')
      .register(generatorOptionKeys, { option: 'blockSize' }),
    prefix_sharing: z
      .enum(PREFIX_SHARINGS)
      .default(GENERATOR_DEFAULTS.prefixSharing)
      .describe(
        "sequences with a common token prefix (a request's n completions, a group's rollouts, a multi-turn rollout's next turn) share its KV blocks, prefilled once: cache = also prefixes of finished sequences, kept until their blocks are needed (LRU); live = only sequences running together; off = none. A weight update invalidates cached prefixes",
      )
      .register(generatorOptionKeys, { option: 'prefixSharing' }),
    max_batched_tokens: positiveInt()
      .default(GENERATOR_DEFAULTS.maxBatchedTokens)
      .describe(
        'tokens one engine step computes, at least max_running: a decode row per running sequence, then chunks of the prompts being prefilled (a long prompt never stalls the running sequences)',
      )
      .register(generatorOptionKeys, { option: 'maxBatchedTokens' }),
    decode_steps: positiveInt()
      .max(64)
      .default(1)
      .describe(
        'decode steps per round trip to the host while nothing waits or prefills (tokens fed back on the device); a sequence ended by a stop string may compute up to decode_steps - 1 dropped tokens',
      ),
    allowed_weight_roots: z
      .array(z.string())
      .optional()
      .describe('folders update_weights may load from; unset = output_dir'),
    replicas: positiveInt()
      .default(1)
      .describe(
        "rl: the inference servers `prime-rl rl` starts, each the whole model, on ports server.port, server.port + 1, ... (prime-rl's vllm.data_parallel_size); `inference` and `worker --pool inference` run one",
      ),
    cpu_cache_mb: z
      .number()
      .int()
      .nonnegative()
      .default(512)
      .describe(
        'freed large CPU tensors the engine keeps for reuse, in MiB (0 = none): decode reuses its buffers, and requests of many shapes fill the cache up to this bound, which stays resident',
      ),
  })
  .superRefine((c, ctx) => {
    // Below seq_len, a long request could never run even alone.
    if (c.kv_cache_tokens !== undefined && c.kv_cache_tokens < c.seq_len) {
      ctx.addIssue({
        code: 'custom',
        path: ['kv_cache_tokens'],
        message: `${c.kv_cache_tokens} is smaller than seq_len (${c.seq_len}): one full-length sequence would not fit; raise kv_cache_tokens or lower seq_len`,
      });
    }
    if (c.gpu_memory_utilization !== undefined && (c.kv_cache_tokens !== undefined || c.model.device === 'cpu')) {
      ctx.addIssue({
        code: 'custom',
        path: ['gpu_memory_utilization'],
        message:
          c.model.device === 'cpu'
            ? 'sizes the KV cache of a CUDA device, and model.device is cpu: set kv_cache_tokens instead'
            : 'set either gpu_memory_utilization or kv_cache_tokens, not both',
      });
    }
    if (c.model.paged_attention_kernel && c.model.device === 'cpu') {
      ctx.addIssue({
        code: 'custom',
        path: ['model', 'paged_attention_kernel'],
        message: 'is a CUDA kernel, and model.device is cpu',
      });
    }
    if (c.max_batched_tokens < c.max_running) {
      ctx.addIssue({
        code: 'custom',
        path: ['max_batched_tokens'],
        message: `${c.max_batched_tokens} is smaller than max_running (${c.max_running}): every running sequence decodes in each step`,
      });
    }
  })
  .prefault({});

/** The servers of `inference.replicas`: the configured one, then the next ports. */
export function replicaServers<S extends { port: number }>(inference: { server: S; replicas: number }): S[] {
  return Array.from({ length: inference.replicas }, (_, i) => ({
    ...inference.server,
    port: inference.server.port + i,
  }));
}

export type InferenceConfig = z.output<typeof inferenceSchema>;
