/**
 * How busy an inference server is, read from its Prometheus `/metrics` page: the sequences it
 * decodes now and those queued for a slot, and its KV cache: the fraction of blocks in use, the
 * sequences it preempted since it started (its blocks ran out), its size in tokens and its context
 * length. The rollouts' concurrency follows them (lib/orchestrator/concurrency.ts). Our server
 * exports the gauges below (lib/inference/metrics.ts); vLLM and SGLang export their own, read the
 * same way, so a fleet of those is followed too.
 */
import {
  CONTEXT_GAUGE,
  KV_CAPACITY_GAUGE,
  KV_USAGE_GAUGE,
  PREEMPTIONS_COUNTER,
  RUNNING_GAUGE,
  WAITING_GAUGE,
} from '../inference/metrics';
import type { ServerLoad } from '../runfolder/inflight-groups';
import type { EngineReading } from './concurrency';

type Counters = Omit<EngineReading, 'id'>;

/** The series each kind of server exports, by what they count (a sum over the series of one name). */
const SERIES: Record<keyof Counters, readonly string[]> = {
  running: [RUNNING_GAUGE, 'vllm:num_requests_running', 'sglang:num_running_reqs'],
  waiting: [WAITING_GAUGE, 'vllm:num_requests_waiting', 'sglang:num_queue_reqs'],
  // Fractions: the highest series (one per engine) is the server's.
  kvUsage: [KV_USAGE_GAUGE, 'vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc', 'sglang:token_usage'],
  preemptions: [PREEMPTIONS_COUNTER, 'vllm:num_preemptions_total', 'vllm:num_preemptions'],
  capacityTokens: [KV_CAPACITY_GAUGE],
  contextTokens: [CONTEXT_GAUGE],
};
const FRACTIONS = new Set<keyof Counters>(['kvUsage']);

/** name{labels} value [timestamp] */
const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)/;

/**
 * The counters on a `/metrics` page (Prometheus text format), or undefined when it exports no
 * running and no waiting series. A series with labels (vLLM's `model_name`, one per engine) is
 * summed over them; vLLM's KV cache size comes from its `cache_config_info` labels.
 */
export function parseServerMetrics(text: string): Counters | undefined {
  const out: Partial<Counters> = {};
  let blocks: number | undefined;
  let blockSize: number | undefined;
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = LINE.exec(line);
    if (!m) continue;
    const value = Number(m[3]);
    if (!Number.isFinite(value)) continue;
    if (m[1] === 'vllm:cache_config_info') {
      const label = (k: string) => Number(new RegExp(`${k}="(\\d+)"`).exec(m[2] ?? '')?.[1]);
      if (Number.isFinite(label('num_gpu_blocks'))) blocks = label('num_gpu_blocks');
      if (Number.isFinite(label('block_size'))) blockSize = label('block_size');
      continue;
    }
    for (const key of Object.keys(SERIES) as (keyof Counters)[])
      if (SERIES[key].includes(m[1]))
        out[key] = FRACTIONS.has(key) ? Math.max(out[key] ?? 0, value) : (out[key] ?? 0) + value;
  }
  if (out.running === undefined || out.waiting === undefined) return undefined;
  if (out.capacityTokens === undefined && blocks !== undefined && blockSize !== undefined)
    out.capacityTokens = blocks * blockSize;
  return out as Counters;
}

/** The load on a `/metrics` page: its running and waiting sequences (undefined without both). */
export function parseServerLoad(text: string): ServerLoad | undefined {
  const c = parseServerMetrics(text);
  return c && { running: c.running, waiting: c.waiting };
}
