/**
 * Inference server benchmark: throughput and latency versus concurrency, and how long an
 * update_weights takes to reach the first token served by the new weights.
 *
 *   npm run build:ts && node dist/bench/inference.js [--models tiny,small] [--concurrency 1,8,32,128] [--max-tokens 64] [--requests 64]
 *   ... --models qwen3-0.6b --device cuda --dtype bfloat16        (Qwen3-0.6B's shape on a GPU, issue #16)
 *
 * Each concurrency level runs C clients in closed loop (a client sends its next request when the
 * previous one returns), at least `requests` requests in all and at least 2 per client, every request a chat completion of
 * exactly `max-tokens` new tokens (ignore_eos). Prints a markdown table for docs/benchmarks/inference.md.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { inferenceSchema } from '../lib/config/schemas';
import { startInferenceServer } from '../lib/inference/server';
import { createModel, type CreateModelOptions } from '../lib/model/create';
import { QWEN3_0_6B } from './shapes';

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}

const MODELS: Record<string, Omit<CreateModelOptions, 'out' | 'seed'>> = {
  tiny: { arch: 'qwen3', preset: 'tiny', tokenizer: 'bytes' },
  small: { arch: 'qwen3', preset: 'small', tokenizer: 'qwen3' },
  'qwen3-0.6b': QWEN3_0_6B,
};

const percentile = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

async function main() {
  const models = arg('models', 'tiny,small').split(',');
  const levels = arg('concurrency', '1,8,32,128').split(',').map(Number);
  const maxTokens = Number(arg('max-tokens', '64'));
  const requests = Number(arg('requests', '64'));
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-bench-inference-'));
  const rows: string[] = [];
  const updates: string[] = [];
  try {
    for (const name of models) {
      const dir = path.join(tmp, name);
      const created = createModel({ ...MODELS[name], seed: 0, out: dir });
      createModel({ ...MODELS[name], seed: 1, out: path.join(tmp, `${name}-step1`) });
      const maxRunning = Math.max(...levels);
      const server = await startInferenceServer(
        inferenceSchema.parse({
          model: { name: dir, device: arg('device', 'cpu'), dtype: arg('dtype', 'float32') },
          seq_len: 256,
          output_dir: tmp,
          server: { port: 0 },
          max_running: maxRunning,
        }),
      );
      const body = JSON.stringify({
        messages: [{ role: 'user', content: 'Reverse the text character-by-character: benchmark' }],
        max_tokens: maxTokens,
        ignore_eos: true,
        temperature: 1,
      });
      const request = async () => {
        const t0 = performance.now();
        const r = await fetch(`${server.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body,
        });
        const json = (await r.json()) as { usage: { completion_tokens: number } };
        return { ms: performance.now() - t0, tokens: json.usage.completion_tokens };
      };
      await request(); // warm-up
      for (const c of levels) {
        const rounds = Math.max(2, Math.ceil(requests / c));
        const latencies: number[] = [];
        let tokens = 0;
        const t0 = performance.now();
        await Promise.all(
          Array.from({ length: c }, async () => {
            for (let i = 0; i < rounds; i++) {
              const r = await request();
              latencies.push(r.ms);
              tokens += r.tokens;
            }
          }),
        );
        const seconds = (performance.now() - t0) / 1000;
        const line = `| ${name} (${(created.parameterCount / 1e6).toFixed(1)}M) | ${c} | ${latencies.length} | ${(tokens / seconds).toFixed(0)} | ${percentile(latencies, 50).toFixed(0)} | ${percentile(latencies, 99).toFixed(0)} |`;
        rows.push(line);
        process.stderr.write(`${line}\n`);
      }

      // update_weights -> first token from the new weights, while 8 clients keep the server busy.
      let busy = true;
      const load = Promise.all(
        Array.from({ length: 8 }, async () => {
          while (busy) await request();
        }),
      );
      await new Promise((r) => setTimeout(r, 500));
      const t0 = performance.now();
      const upd = await fetch(`${server.url}/update_weights`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ weight_dir: path.join(tmp, `${name}-step1`), version: 1 }),
      });
      if (!upd.ok) throw new Error(`update_weights failed: ${await upd.text()}`);
      const applied = performance.now() - t0;
      const first = await fetch(`${server.url}/v1/generate`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt_token_ids: [1, 2, 3], max_tokens: 1 }),
      });
      const version = ((await first.json()) as { policy_version: number }).policy_version;
      const total = performance.now() - t0;
      busy = false;
      await load;
      if (version !== 1) throw new Error(`expected policy version 1, got ${version}`);
      updates.push(`| ${name} | ${applied.toFixed(0)} | ${total.toFixed(0)} |`);
      await server.close();
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  process.stdout.write(
    [
      `Machine: ${os.cpus().length} x ${os.cpus()[0].model}; ${maxTokens} new tokens per request, closed-loop clients.`,
      '',
      '| model | concurrency | requests | output tokens/s | p50 latency (ms) | p99 latency (ms) |',
      '| --- | ---: | ---: | ---: | ---: | ---: |',
      ...rows,
      '',
      'update_weights under load (8 busy clients): time until the call returns (weights live) and until the first token of the new policy.',
      '',
      '| model | update_weights returns (ms) | first new-policy token (ms) |',
      '| --- | ---: | ---: |',
      ...updates,
      '',
    ].join('\n'),
  );
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack}\n`);
  process.exit(1);
});
