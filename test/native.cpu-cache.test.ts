/**
 * The engine's caching CPU allocator (native/src/cpu_cache.h): freed large tensors are reused by
 * the next allocation of their size, at most the capacity stays cached, and capacity 0 frees the
 * cache and turns it off. A model trained with the cache on and off takes the same steps.
 */
import { cpuCacheStats, setCpuCache, setThreads, type TrainRow } from '../native';
import { matmulGflops } from '../native/checks';
import { loadModel } from '../lib/model/engine';
import { packRow, randomTokens, randomWeights, tinyConfig } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';

setThreads(1);
const MiB = 1 << 20;

const initial = cpuCacheStats().capacityBytes;
afterAll(() => setCpuCache(initial)); // as it was, for the files that share this process

test('large blocks are reused, the capacity bounds what stays cached, 0 turns the cache off', async () => {
  setCpuCache(64 * MiB);
  // Three 512 x 512 fp32 matrices of 1 MiB each per call: the first call's come back to the cache.
  await matmulGflops(512, 1);
  const warm = cpuCacheStats();
  expect(warm.capacityBytes).toBe(64 * MiB);
  expect(warm.cachedBytes).toBeGreaterThanOrEqual(3 * MiB);
  expect(warm.cachedBytes).toBeLessThanOrEqual(64 * MiB);
  await matmulGflops(512, 1);
  const again = cpuCacheStats();
  expect(again.hits - warm.hits).toBeGreaterThanOrEqual(3);
  expect(again.misses).toBe(warm.misses);

  // 1024 x 1024 matrices are 4 MiB each: a capacity of 6 MiB keeps one of them, never more.
  setCpuCache(6 * MiB);
  expect(cpuCacheStats().cachedBytes).toBeLessThanOrEqual(6 * MiB);
  await matmulGflops(1024, 1);
  expect(cpuCacheStats().cachedBytes).toBeLessThanOrEqual(6 * MiB);

  setCpuCache(0);
  expect(cpuCacheStats().cachedBytes).toBe(0);
  const off = cpuCacheStats();
  await matmulGflops(512, 1);
  const after = cpuCacheStats();
  expect(after.hits).toBe(off.hits);
  expect(after.misses - off.misses).toBeGreaterThanOrEqual(3);
  expect(after.cachedBytes).toBe(0);
  expect(() => setCpuCache(-1)).toThrow('CPU cache capacity must be >= 0 bytes');
});

test('training takes the same steps with the cache on and off', async () => {
  // A vocabulary large enough that the logits and the embedding's gradient are cached blocks.
  const cfg = tinyConfig('qwen3', { vocabSize: 8192, hiddenSize: 64, numLayers: 2 });
  const weights = randomWeights(cfg, 3);
  const rng = new Rng(4);
  const row: TrainRow = {
    ...packRow([randomTokens(rng, 48, cfg.vocabSize), randomTokens(rng, 48, cfg.vocabSize)]),
    lossMask: Array.from({ length: 96 }, (_, i) => i % 48 >= 16),
  };
  const losses = async (capacity: number) => {
    setCpuCache(capacity);
    const trainer = (await loadModel(cfg, weights)).createTrainer({});
    const out: number[] = [];
    for (let s = 0; s < 3; s++) out.push((await trainer.step([row], { lr: 1e-2, loss: { kind: 'ce' } })).metrics.loss);
    return out;
  };
  const before = cpuCacheStats().hits;
  const cached = await losses(256 * MiB);
  expect(cpuCacheStats().hits).toBeGreaterThan(before);
  expect(await losses(0)).toEqual(cached);
});
