/**
 * The rollouts' concurrency (lib/orchestrator/concurrency.ts) against hand-computed limits, and the
 * server counters it reads (lib/orchestrator/server-load.ts), ours, vLLM's and SGLang's.
 */
import { ConcurrencyController, fixedLimit, GROWTH, type EngineReading } from '../../lib/orchestrator/concurrency';
import { parseServerMetrics } from '../../lib/orchestrator/server-load';

const reading = (r: Partial<EngineReading> = {}): EngineReading[] => [
  { id: 's', running: 4, waiting: 0, kvUsage: 0.2, preemptions: 0, ...r },
];

test('starts at initial_inflight, else at the KV cache over the context length, within the bounds', () => {
  expect(new ConcurrencyController({ initial_inflight: 12, min_inflight: 1, max_inflight: 64 }, 256).limit).toBe(12);
  const c = new ConcurrencyController({ min_inflight: 2, max_inflight: 64 }, 256);
  expect(c.limit).toBe(2); // no reading yet: min_inflight
  // Two servers of 4096 KV tokens, contexts of 512: 8192 / 512 = 16.
  c.observe(
    [
      { id: 'a', running: 0, waiting: 0, capacityTokens: 4096, contextTokens: 512 },
      { id: 'b', running: 0, waiting: 0, capacityTokens: 4096, contextTokens: 512 },
    ],
    0,
  );
  expect(c.limit).toBe(16);
  // A server without a context gauge: the run's seq_len; the start is clamped to max_inflight.
  const d = new ConcurrencyController({ min_inflight: 1, max_inflight: 10 }, 100);
  d.observe(reading({ capacityTokens: 5000 }), 0);
  expect(d.limit).toBe(10);
});

test('grows by GROWTH per turnover while the servers are clear and the limit binds', () => {
  const c = new ConcurrencyController({ initial_inflight: 40, min_inflight: 1, max_inflight: 100 }, 256);
  c.observe(reading(), 40);
  // Each finished rollout of a pool of 40: x 1.25^(1/40).
  for (let i = 0; i < 21; i++) c.finished(39);
  expect(c.limit).toBe(44); // 40 x 1.25^(21/40) = 44.97
  c.finished(39);
  expect(c.limit).toBe(45); // 40 x 1.25^(22/40) = 45.2
  // 40 in flight of a limit of 45 is below 0.9 x 45: the limit no longer binds, no growth.
  for (let i = 0; i < 20; i++) c.finished(39);
  expect(c.limit).toBe(45);
  // Not clear: KV usage at 0.6 or more, or a queue that grew: no growth.
  c.observe(reading({ kvUsage: 0.65 }), 45);
  for (let i = 0; i < 20; i++) c.finished(44);
  expect(c.limit).toBe(45);
  for (let i = 0; i < 5; i++) c.observe(reading(), 45); // the 0.65 leaves the window
  c.observe(reading({ waiting: 1 }), 45);
  c.observe(reading({ waiting: 2 }), 45);
  for (let i = 0; i < 20; i++) c.finished(44);
  expect(c.limit).toBe(45);
  expect(GROWTH).toBe(1.25);
  // Never above max_inflight.
  const m = new ConcurrencyController({ initial_inflight: 4, min_inflight: 1, max_inflight: 5 }, 256);
  m.observe(reading(), 4);
  for (let i = 0; i < 100; i++) m.finished(4);
  expect(m.limit).toBe(5);
});

test('a queue that comes and goes or holds does not stop growth; one that grew over two readings does', () => {
  // Readings as a multi-turn workload gives them without pressure: turns wait for the next step.
  const c = new ConcurrencyController({ initial_inflight: 40, min_inflight: 1, max_inflight: 100 }, 256);
  c.observe(reading({ running: 10, waiting: 3 }), 40); // a queue that was not there before
  expect(c.signal).toBe('clear');
  for (let i = 0; i < 20; i++) c.finished(39);
  expect(c.limit).toBe(44); // 40 x 1.25^(20/40) = 44.7
  c.observe(reading({ running: 10, waiting: 3 }), 44); // the same queue again: the servers run what they can
  expect(c.signal).toBe('clear');
  for (let i = 0; i < 22; i++) c.finished(43);
  expect(c.limit).toBe(49); // 44.72 x 1.25^(22/44) = 50.0 (22 finished of a pool of 44: 49.99)
  c.observe(reading({ running: 10, waiting: 5 }), 49); // the queue grew: the limit is past what they run
  expect(c.signal).toBe('busy');
  for (let i = 0; i < 20; i++) c.finished(48);
  expect(c.limit).toBe(49);
  c.observe(reading({ running: 10, waiting: 2 }), 49); // it shrank
  expect(c.signal).toBe('clear');
});

test('KV usage holds growth while any of the last 6 readings reached 0.6', () => {
  // A multi-turn workload under KV pressure: usage swings as episodes leave between turns.
  const c = new ConcurrencyController({ initial_inflight: 20, min_inflight: 1, max_inflight: 100 }, 256);
  c.observe(reading({ kvUsage: 0.7 }), 20);
  for (const kvUsage of [0.35, 0.4, 0.3, 0.45, 0.5]) {
    c.observe(reading({ kvUsage }), 20);
    expect(c.signal).toBe('busy');
    for (let i = 0; i < 20; i++) c.finished(19);
    expect(c.limit).toBe(20);
  }
  c.observe(reading({ kvUsage: 0.3 }), 20); // the 0.7 is 6 readings back
  expect(c.signal).toBe('clear');
  for (let i = 0; i < 20; i++) c.finished(19);
  expect(c.limit).toBe(23); // 20 x 1.25^(13/20) = 23.1; then 20 in flight no longer binds a limit of 23
});

test('a preemption cuts to 0.8 x in flight, then nothing cuts again until the pool drained; a repeat right after cuts to half', () => {
  const c = new ConcurrencyController({ initial_inflight: 50, min_inflight: 4, max_inflight: 100 }, 256);
  c.observe(reading({ preemptions: 3 }), 50); // the first reading: the counter's base
  expect(c.limit).toBe(50);
  c.observe(reading({ preemptions: 5 }), 50);
  expect([c.limit, c.signal, c.counts.preempted]).toEqual([40, 'overloaded', 2]);
  // Still 45 in flight (above the new limit): more preemptions are the old load, no cut.
  c.observe(reading({ preemptions: 9 }), 45);
  expect(c.limit).toBe(40);
  // Drained to the limit with the servers settled: the drain is over; a repeat now is escalated.
  c.observe(reading({ preemptions: 9 }), 40);
  c.observe(reading({ preemptions: 10 }), 40);
  expect(c.limit).toBe(20);
  // No growth while draining.
  for (let i = 0; i < 50; i++) c.finished(30);
  expect(c.limit).toBe(20);
  // Never below min_inflight.
  const f = new ConcurrencyController({ initial_inflight: 5, min_inflight: 4, max_inflight: 8 }, 256);
  f.observe(reading({ preemptions: 0 }), 5);
  f.observe(reading({ preemptions: 1 }), 5);
  expect(f.limit).toBe(4);
});

test('requests queued beyond half the running ones for 6 readings in a row cut to 0.9 x in flight', () => {
  const c = new ConcurrencyController({ initial_inflight: 40, min_inflight: 1, max_inflight: 100 }, 256);
  for (let i = 0; i < 5; i++) c.observe(reading({ running: 10, waiting: 6 }), 40);
  expect(c.limit).toBe(40);
  c.observe(reading({ running: 10, waiting: 4 }), 40); // 4 <= 0.5 x 10: the count restarts
  for (let i = 0; i < 5; i++) c.observe(reading({ running: 10, waiting: 6 }), 40);
  expect(c.limit).toBe(40);
  c.observe(reading({ running: 10, waiting: 6 }), 40);
  expect([c.limit, c.counts.queue]).toEqual([36, 1]);
});

test('KV usage above 0.8 trims to in flight x 0.7 / usage, at most once per 6 readings', () => {
  const c = new ConcurrencyController({ initial_inflight: 40, min_inflight: 1, max_inflight: 100 }, 256);
  c.observe(reading({ kvUsage: 0.875 }), 40);
  expect(c.limit).toBe(32); // 40 x 0.7 / 0.875
  c.observe(reading({ kvUsage: 0.95 }), 32);
  expect(c.limit).toBe(32); // cooldown
  for (let i = 0; i < 4; i++) c.observe(reading({ kvUsage: 0.5 }), 32);
  c.observe(reading({ kvUsage: 0.9 }), 32);
  expect(c.limit).toBe(24); // 32 x 0.7 / 0.9 = 24.9
});

test('without a load signal the limit stays where it started; an external API runs at initial_inflight, else 64', () => {
  const c = new ConcurrencyController({ initial_inflight: 8, min_inflight: 1, max_inflight: 100 }, 256);
  c.observe(undefined, 8);
  for (let i = 0; i < 50; i++) c.finished(7);
  expect(c.limit).toBe(8);
  expect(fixedLimit({ min_inflight: 1, max_inflight: 1024 })).toBe(64);
  expect(fixedLimit({ min_inflight: 32, max_inflight: 32 })).toBe(32);
  expect(fixedLimit({ initial_inflight: 5, min_inflight: 1, max_inflight: 1024 })).toBe(5);
});

test("the counters on /metrics: ours, vLLM's (per engine: summed, the highest usage) and SGLang's", () => {
  const ours = [
    'prime_inference_running_sequences 12',
    'prime_inference_waiting_sequences 3',
    'prime_inference_kv_cache_usage 0.5',
    'prime_inference_preemptions_total 7',
    'prime_inference_kv_capacity_tokens 8192',
    'prime_inference_context_tokens 1024',
  ].join('\n');
  expect(parseServerMetrics(ours)).toEqual({
    running: 12,
    waiting: 3,
    kvUsage: 0.5,
    preemptions: 7,
    capacityTokens: 8192,
    contextTokens: 1024,
  });
  const vllm = [
    'vllm:num_requests_running{engine="0",model_name="a"} 4.0',
    'vllm:num_requests_running{engine="1",model_name="a"} 5.0',
    'vllm:num_requests_waiting{engine="0",model_name="a"} 0.0',
    'vllm:num_requests_waiting{engine="1",model_name="a"} 2.0',
    'vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.25',
    'vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.75',
    'vllm:num_preemptions_total{engine="0",model_name="a"} 1.0',
    'vllm:num_preemptions_total{engine="1",model_name="a"} 2.0',
    'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000",engine="0"} 1.0',
  ].join('\n');
  expect(parseServerMetrics(vllm)).toEqual({
    running: 9,
    waiting: 2,
    kvUsage: 0.75,
    preemptions: 3,
    capacityTokens: 16000,
  });
  expect(parseServerMetrics('sglang:num_running_reqs 7\nsglang:num_queue_reqs 1\nsglang:token_usage 0.3\n')).toEqual({
    running: 7,
    waiting: 1,
    kvUsage: 0.3,
  });
  expect(parseServerMetrics('process_cpu_seconds_total 3\n')).toBeUndefined();
});
