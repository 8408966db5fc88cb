/** Prometheus metrics of the inference server (`GET /metrics`), read from the scheduler when scraped. */
import { Counter, Gauge, Registry } from 'prom-client';
import * as native from '../../native';
import type { CacheStats, StateSlotStats } from '../../native';
import type { Scheduler } from './scheduler';

/** The load gauges, also read by the orchestrator (lib/orchestrator/server-load.ts). */
export const RUNNING_GAUGE = 'prime_inference_running_sequences';
export const WAITING_GAUGE = 'prime_inference_waiting_sequences';
/** The KV cache's gauges the orchestrator's concurrency follows (lib/orchestrator/concurrency.ts). */
export const KV_USAGE_GAUGE = 'prime_inference_kv_cache_usage';
export const PREEMPTIONS_COUNTER = 'prime_inference_preemptions_total';
export const KV_CAPACITY_GAUGE = 'prime_inference_kv_capacity_tokens';
export const CONTEXT_GAUGE = 'prime_inference_context_tokens';

/** The engine's KV cache, as the generator reports it. */
const CACHE_GAUGES: [string, string, NumericKeys<CacheStats>][] = [
  [KV_USAGE_GAUGE, 'fraction of the KV cache blocks in use', 'cacheUsage'],
  [KV_CAPACITY_GAUGE, 'the KV cache in token positions (blocks x block size)', 'capacityTokens'],
  [CONTEXT_GAUGE, 'the longest sequence the server holds (its context length)', 'maxSequenceLength'],
  ['prime_inference_kv_blocks_in_use', 'KV cache blocks held by sequences', 'blocksInUse'],
  ['prime_inference_kv_blocks_total', 'KV cache blocks in the pool', 'numBlocks'],
  [
    'prime_inference_kv_blocks_cached',
    "KV cache blocks nobody holds that keep a finished sequence's prefix for reuse",
    'blocksCached',
  ],
  [
    'prime_inference_preempted_sequences',
    'sequences preempted (blocks freed) waiting to be recomputed',
    'preemptedSequences',
  ],
  [PREEMPTIONS_COUNTER, 'sequences preempted since start', 'preemptions'],
  [
    'prime_inference_prefill_tokens_total',
    'prompt positions computed since start (shared prefixes are not computed again)',
    'prefillTokens',
  ],
  [
    'prime_inference_prefix_hit_tokens_total',
    'positions taken from blocks another sequence computed (prefix sharing) since start',
    'prefixHitTokens',
  ],
];
/** The per-sequence state slots of a hybrid model's cache (registered for hybrid models only). */
const STATE_GAUGES: [string, string, keyof StateSlotStats][] = [
  ['prime_inference_state_slots_total', 'per-sequence state slots (hybrid models: recurrent layers)', 'slots'],
  ['prime_inference_state_slots_in_use', 'state slots held by running sequences', 'inUse'],
  [
    'prime_inference_state_slots_cached',
    'state slots holding state snapshots the prefix cache keeps for reuse',
    'cached',
  ],
  ['prime_inference_state_slot_bytes', 'bytes of one state slot', 'slotBytes'],
];
type NumericKeys<T> = { [K in keyof T]-?: T[K] extends number ? K : never }[keyof T];

/** Tokens/s over this trailing window. */
const RATE_WINDOW_MS = 10_000;

export class InferenceMetrics {
  readonly registry = new Registry();
  private readonly requests: Counter<'route' | 'status'>;
  private readonly weightUpdates: Counter<'source'>;
  private samples: { t: number; tokens: number }[] = [];

  constructor(scheduler: Scheduler) {
    const registers = [this.registry];
    this.requests = new Counter({
      name: 'prime_inference_requests_total',
      help: 'HTTP requests by route and status',
      labelNames: ['route', 'status'],
      registers,
    });
    this.weightUpdates = new Counter({
      name: 'prime_inference_weight_updates_total',
      help: 'policy versions loaded by /update_weights, by where their weights came from: a broadcast, or the folder',
      labelNames: ['source'],
      registers,
    });
    const gauge = (name: string, help: string, read: () => number) =>
      new Gauge({
        name,
        help,
        registers,
        collect() {
          this.set(read());
        },
      });
    gauge(RUNNING_GAUGE, 'sequences in the running batch', () => scheduler.runningCount);
    gauge(WAITING_GAUGE, 'sequences queued for a slot', () => scheduler.waitingCount);
    for (const [name, help, key] of CACHE_GAUGES) gauge(name, help, () => scheduler.cache[key]);
    if (scheduler.cache.state)
      for (const [name, help, key] of STATE_GAUGES) gauge(name, help, () => scheduler.cache.state?.[key] ?? 0);
    gauge('prime_inference_policy_version', 'policy version being served', () => scheduler.policy.version);
    gauge('prime_inference_generation_tokens_total', 'tokens sampled since start', () => scheduler.generatedTokens);
    gauge('prime_inference_prompt_tokens_total', 'prompt tokens prefilled since start', () => scheduler.promptTokens);
    // Where the server's memory is: the process, its JS heap, and freed engine blocks kept for reuse.
    gauge('prime_inference_resident_bytes', 'resident memory of the server process', () => process.memoryUsage().rss);
    gauge('prime_inference_js_heap_bytes', 'JavaScript heap in use', () => process.memoryUsage().heapUsed);
    gauge(
      'prime_inference_cpu_cache_bytes',
      "freed large CPU tensors the engine's caching allocator keeps for reuse",
      () => native.cpuCacheStats().cachedBytes,
    );
    gauge(
      'prime_inference_generation_tokens_per_second',
      `sampled tokens per second over the last ${RATE_WINDOW_MS / 1000} s`,
      () => this.rate(scheduler.generatedTokens),
    );
  }

  countWeightUpdate(source: 'broadcast' | 'filesystem'): void {
    this.weightUpdates.inc({ source });
  }

  countRequest(route: string, status: number): void {
    this.requests.inc({ route, status: String(status) });
  }

  private rate(total: number): number {
    const t = Date.now();
    this.samples.push({ t, tokens: total });
    this.samples = this.samples.filter((s) => t - s.t <= RATE_WINDOW_MS);
    const first = this.samples[0];
    return t > first.t ? ((total - first.tokens) * 1000) / (t - first.t) : 0;
  }
}
