/** `prime-rl inference`: serve a model until SIGTERM / Ctrl-C, then drain and exit 0. */
import { ConfigError } from '../failures';
import type { InferenceConfig } from '../config/schemas';
import { startInferenceServer } from '../inference/server';
import { announceReady } from '../proc';

export async function runInference(config: InferenceConfig): Promise<void> {
  if (config.replicas > 1)
    throw new ConfigError(
      `replicas (${config.replicas}): one process serves one server; start one per port (prime-rl rl starts inference.replicas of them itself)`,
    );
  const server = await startInferenceServer(config);
  process.stdout.write(`Serving ${config.model.name} on ${server.url} (OpenAI API at ${server.url}/v1)\n`);
  announceReady();
  await new Promise<void>((resolve) => {
    const stop = (signal: string) => {
      process.stdout.write(`${signal}: finishing running requests, then exiting\n`);
      void server.close().then(resolve);
    };
    process.once('SIGTERM', () => stop('SIGTERM'));
    process.once('SIGINT', () => stop('SIGINT'));
  });
}
