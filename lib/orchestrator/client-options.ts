/**
 * How an rl run's orchestrator (its rollouts and its evals) talks to the run's inference servers,
 * from the `inference` section that configures them. Type imports only: the rl workflow uses it.
 */
import type { RLConfig } from '../config/schemas';
import type { InferenceClientOptions } from './client';

/**
 * The key the servers want (`inference.server.api_key_var`), and at most max_running + max_queued
 * requests in flight per server: what a server takes before it answers 429. A 429 that still comes
 * (another client's load, a queue not yet drained) is retried with backoff by the client. A server
 * silent for `temporal.heartbeat_timeout_s` (the run's one span after which silence means dead)
 * is unavailable.
 */
export function rlClientOptions(config: RLConfig): InferenceClientOptions {
  const i = config.inference;
  return {
    apiKeyVar: i.server.api_key_var,
    apiKeySetting: 'inference.server.api_key_var',
    maxInFlight: i.max_running + i.max_queued,
    livenessMs: config.temporal.heartbeat_timeout_s * 1000,
  };
}
