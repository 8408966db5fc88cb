// The config keys that set engine generator options (lib/config/schemas/engine-options.ts): every
// option the engine declares reaches a key or is declared engine-only, and the server's options
// follow the config.
import { inferenceSchema } from '../../lib/config/schemas';
import {
  ENGINE_ONLY_OPTIONS,
  GENERATOR_OPTION_NAMES,
  registeredGeneratorKeys,
} from '../../lib/config/schemas/engine-options';
import { generatorOptionsOf, refusedKeyOf } from '../../lib/inference/server/generator-options';

const keys = registeredGeneratorKeys(inferenceSchema);

test('every generator option the engine declares is set by one config key or declared engine-only', () => {
  const registered = keys.map((k) => k.option);
  expect(new Set(registered).size).toBe(registered.length);
  expect([...registered, ...ENGINE_ONLY_OPTIONS].sort()).toEqual([...GENERATOR_OPTION_NAMES].sort());
  expect(keys.map((k) => k.path.join('.'))).toEqual([
    'model.enforce_eager',
    'model.paged_attention_kernel',
    'max_running',
    'kv_cache_tokens',
    'gpu_memory_utilization',
    'block_size',
    'prefix_sharing',
    'max_batched_tokens',
  ]);
});

test("the generator's options are the config's values, unset keys left to the engine", () => {
  const defaults = inferenceSchema.parse({ model: { name: 'm' } });
  expect(generatorOptionsOf(defaults, 512)).toEqual({
    maxSequenceLength: 512,
    cudaGraphs: true,
    pagedAttentionKernel: false,
    maxSequences: 64,
    blockSize: 16,
    prefixSharing: 'cache',
    maxBatchedTokens: 2048,
  });
  const set = inferenceSchema.parse({
    model: { name: 'm', enforce_eager: true },
    max_running: 8,
    kv_cache_tokens: 4096,
    block_size: 32,
    prefix_sharing: 'off',
    max_batched_tokens: 256,
  });
  expect(generatorOptionsOf(set, 1024)).toEqual({
    maxSequenceLength: 1024,
    cudaGraphs: false,
    pagedAttentionKernel: false,
    maxSequences: 8,
    kvCacheTokens: 4096,
    blockSize: 32,
    prefixSharing: 'off',
    maxBatchedTokens: 256,
  });
});

test('a refused option names the key that set it', () => {
  expect(refusedKeyOf('pagedAttentionKernel')).toEqual({
    key: 'inference.model.paged_attention_kernel',
    hint: 'leave it false',
  });
  expect(refusedKeyOf('gpuMemoryUtilization')).toEqual({
    key: 'inference.gpu_memory_utilization',
    hint: 'raise it, or set kv_cache_tokens',
  });
  expect(refusedKeyOf('blockSize')).toBeUndefined();
});
