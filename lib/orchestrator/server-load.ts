/**
 * How busy an inference server is, read from its Prometheus `/metrics` page: the sequences it
 * decodes now and the sequences queued for a slot. In-flight mode's producer follows it
 * (lib/orchestrator/inflight.ts `Concurrency`). Our server exports the gauges below
 * (lib/inference/metrics.ts); vLLM and SGLang export their own, read the same way, so a fleet of
 * those is followed too.
 */
import { RUNNING_GAUGE, WAITING_GAUGE } from '../inference/metrics';
import type { ServerLoad } from '../runfolder/inflight';

/** The gauges each kind of server exports, by what they count. */
const LOAD_GAUGES: Record<keyof ServerLoad, readonly string[]> = {
  running: [RUNNING_GAUGE, 'vllm:num_requests_running', 'sglang:num_running_reqs'],
  waiting: [WAITING_GAUGE, 'vllm:num_requests_waiting', 'sglang:num_queue_reqs'],
};

/**
 * The load on a `/metrics` page (Prometheus text format), or undefined when it exports no running
 * and no waiting gauge of LOAD_GAUGES. A gauge with labels (vLLM's `model_name`, one series per
 * engine) counts as the sum of its series.
 */
export function parseServerLoad(text: string): ServerLoad | undefined {
  const sums: Partial<Record<keyof ServerLoad, number>> = {};
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    // name{labels} value [timestamp]
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const value = Number(m[2]);
    if (!Number.isFinite(value)) continue;
    for (const key of ['running', 'waiting'] as const)
      if (LOAD_GAUGES[key].includes(m[1])) sums[key] = (sums[key] ?? 0) + value;
  }
  if (sums.running === undefined || sums.waiting === undefined) return undefined;
  return { running: sums.running, waiting: sums.waiting };
}
