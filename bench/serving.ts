/**
 * Serving workloads through the inference server, as a user runs it (`prime-rl inference` in a
 * process of its own, real HTTP):
 *
 * --workload rl: one RL step's generation, P prompts of L tokens with R rollouts each, every
 * rollout a request of its own as the orchestrator sends a group, N new tokens (ignore_eos), all in
 * flight at once: the wall time and the prompt positions the engine computed
 * (prime_inference_prefill_tokens_total), with prefix sharing off and on ('cache'), alternating.
 *
 *   npm run build:ts && node dist/bench/serving.js --workload rl [--model small] [--prompts 16]
 *     [--prompt-len 512] [--rollouts 16] [--new 128] [--max-running 256] [--repeats 1]
 *
 * --workload capacity: at a fixed KV budget (--kv-tokens), requests with max_tokens 1,024 whose
 * completions end after about 100 tokens (stop tokens a near-uniform random model samples about
 * once in 100 draws), all sent at once: how many sequences run at once while requests still
 * wait (prime_inference_running_sequences less the preempted ones, sampled every 20 ms), this
 * checkout against another
 * (--cli: a checkout with its own build, e.g. of the commit before paging, whose scheduler
 * reserved prompt + max_tokens for each sequence).
 *
 *   node dist/bench/serving.js --workload capacity --cli OTHER_CHECKOUT [--kv-tokens 16384] [--requests 1024]
 *     [--max-running 256]
 *
 * --model tiny|small|qwen3-0.6b|qwen3_5-tiny|qwen3_5-small|qwen3_5-0.8b (Qwen3-0.6B's shape; Qwen3.5's
 * tiny and small presets as hybrids, Qwen3.5-0.8B's shape: bench/shapes.ts); --device, --dtype: the servers'
 * (`cuda`, `bfloat16` on a GPU machine); --threads: their compute threads (default 2).
 */
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as os from 'node:os';
import * as path from 'node:path';
import { createModel, type CreateModelOptions } from '../lib/model/create';
import { Rng } from '../lib/model/rng';
import { randomTokens } from '../lib/model/testing';
import { QWEN3_0_6B, QWEN3_5_0_8B, SMALL_QWEN3_5, TINY_QWEN3_5 } from './shapes';
import { serverMetric, startServerProcess } from './server-process';

const ROOT = path.resolve(__dirname, '..', '..');

const MODELS: Record<string, Omit<CreateModelOptions, 'out' | 'seed'>> = {
  tiny: { arch: 'qwen3', preset: 'tiny', tokenizer: 'bytes' },
  small: { arch: 'qwen3', preset: 'small', tokenizer: 'bytes' },
  'qwen3-0.6b': QWEN3_0_6B,
  // Qwen3.5 (issue #46): the hybrid cache's state snapshots shared by a group's rollouts.
  'qwen3_5-tiny': TINY_QWEN3_5,
  'qwen3_5-small': SMALL_QWEN3_5,
  'qwen3_5-0.8b': QWEN3_5_0_8B,
};

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}

/** `prime-rl inference` of checkout `root` serving modelDir with these flags (--device, --dtype, --threads). */
const startServer = (root: string, modelDir: string, tmp: string, flags: string[]) =>
  startServerProcess(root, modelDir, tmp, flags, {
    device: arg('device', 'cpu'),
    dtype: arg('dtype', 'float32'),
    threads: arg('threads', '2'),
  });
const metric = serverMetric;

/**
 * POST /v1/completions over node:http: unlike fetch (undici: 300 s until the response headers),
 * no client-side limit, as a request queued behind hundreds of others waits minutes on a CPU.
 */
function complete(url: string, body: object): Promise<{ completion_tokens: number }> {
  const data = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = http.request(
      `${url}/v1/completions`,
      { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } },
      (res) => {
        let text = '';
        res.on('data', (d) => (text += d));
        res.on('end', () => {
          if (res.statusCode !== 200) reject(new Error(`${res.statusCode}: ${text}`));
          else resolve((JSON.parse(text) as { usage: { completion_tokens: number } }).usage);
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(data);
  });
}

async function rlWorkload(modelDir: string, tmp: string): Promise<string> {
  const P = Number(arg('prompts', '16')),
    L = Number(arg('prompt-len', '512')),
    R = Number(arg('rollouts', '16')),
    N = Number(arg('new', '128'));
  const maxRunning = arg('max-running', '256');
  const rng = new Rng(1);
  const prompts = Array.from({ length: P }, () => randomTokens(rng, L, 256));
  const rows: string[] = [];
  const results: Record<string, { seconds: number; prefill: number }[]> = { off: [], cache: [] };
  for (let rep = 0; rep < Number(arg('repeats', '1')); rep++) {
    for (const sharing of ['off', 'cache'] as const) {
      const server = await startServer(ROOT, modelDir, tmp, [
        '--seq-len',
        String(L + N + 1),
        '--max-running',
        maxRunning,
        '--max-queued',
        String(P * R),
        '--prefix-sharing',
        sharing,
      ]);
      try {
        await complete(server.url, { prompt: [1, 2, 3], max_tokens: 4 }); // warm-up
        const before = await metric(server.url, 'prime_inference_prefill_tokens_total');
        const t0 = performance.now();
        await Promise.all(
          prompts.flatMap((prompt, p) =>
            Array.from({ length: R }, (_, r) =>
              complete(server.url, { prompt, max_tokens: N, ignore_eos: true, seed: p * R + r }),
            ),
          ),
        );
        const seconds = (performance.now() - t0) / 1000;
        const prefill = (await metric(server.url, 'prime_inference_prefill_tokens_total')) - before;
        results[sharing]!.push({ seconds, prefill });
        process.stderr.write(
          `[bench] rl workload, prefix sharing ${sharing}: ${seconds.toFixed(1)} s, ${prefill} prefilled\n`,
        );
      } finally {
        await server.stop();
      }
    }
  }
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  for (const sharing of ['off', 'cache'] as const) {
    const r = results[sharing]!;
    rows.push(
      `| ${sharing} | ${r.map((x) => x.seconds.toFixed(1)).join(', ')} | ${mean(r.map((x) => x.prefill)).toFixed(0)} | ${((P * R * N) / mean(r.map((x) => x.seconds))).toFixed(0)} |`,
    );
  }
  const ratio = mean(results.off!.map((x) => x.seconds)) / mean(results.cache!.map((x) => x.seconds));
  return [
    `${P} prompts of ${L} tokens x ${R} rollouts (separate requests), ${N} new tokens each; max_running ${maxRunning}; ${P * R * L} prompt tokens in all.`,
    '',
    '| prefix_sharing | wall time (s) | prompt positions computed | new tokens/s |',
    '| --- | ---: | ---: | ---: |',
    ...rows,
    '',
    `Wall time, off / cache: ${ratio.toFixed(2)}x.`,
  ].join('\n');
}

async function capacityWorkload(modelDir: string, tmp: string): Promise<string> {
  const kv = arg('kv-tokens', '16384'),
    n = Number(arg('requests', '1024')),
    maxRunning = arg('max-running', '256');
  const other = arg('cli', '');
  if (!other) throw new Error('--workload capacity needs --cli OTHER_CHECKOUT (the build to compare with)');
  const rng = new Rng(2);
  const prompts = Array.from({ length: n }, () => randomTokens(rng, 32, 256));
  // A stop token the random model draws about once in 100 steps: a completion ends after about
  // 100 tokens (a geometric length; the mean is in the table).
  const stops = [10];
  const rows: string[] = [];
  for (const [label, root] of [
    ['this checkout', ROOT],
    [`--cli ${other}`, path.resolve(other)],
  ] as const) {
    const server = await startServer(root, modelDir, tmp, [
      '--seq-len',
      '1100',
      '--kv-cache-tokens',
      kv,
      '--max-running',
      maxRunning,
      '--max-queued',
      String(n),
    ]);
    try {
      const samples: number[] = [];
      let done = false;
      const sampler = (async () => {
        while (!done) {
          const [running, preempted, waiting] = await Promise.all([
            metric(server.url, 'prime_inference_running_sequences'),
            metric(server.url, 'prime_inference_preempted_sequences'), // (NaN: a build without preemption)
            metric(server.url, 'prime_inference_waiting_sequences'),
          ]);
          if (waiting > 0) samples.push(running - (preempted || 0));
          await new Promise((r) => setTimeout(r, 20));
        }
      })();
      const t0 = performance.now();
      const usage = await Promise.all(
        prompts.map((prompt, i) =>
          complete(server.url, { prompt, max_tokens: 1024, stop_token_ids: stops, seed: i, temperature: 1 }),
        ),
      );
      const seconds = (performance.now() - t0) / 1000;
      done = true;
      await sampler;
      const tokens = usage.map((u) => u.completion_tokens);
      const preemptions = await metric(server.url, 'prime_inference_preemptions_total'); // NaN: a build without
      const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
      rows.push(
        `| ${label} | ${mean(samples).toFixed(1)} | ${Math.max(...samples)} | ${Number.isNaN(preemptions) ? '-' : preemptions} | ${mean(tokens).toFixed(0)} | ${seconds.toFixed(1)} | ${(tokens.reduce((a, b) => a + b, 0) / seconds).toFixed(0)} |`,
      );
      process.stderr.write(`[bench] capacity, ${label}: ${rows[rows.length - 1]}\n`);
    } finally {
      await server.stop();
    }
  }
  return [
    `kv_cache_tokens ${kv}; ${n} requests of 32 prompt tokens, max_tokens 1024, sent at once (max_running ${maxRunning}); completions end at a stop token.`,
    '',
    '| server | sequences running while requests wait (mean) | max | preemptions | mean completion (tokens) | wall (s) | new tokens/s |',
    '| --- | ---: | ---: | ---: | ---: | ---: | ---: |',
    ...rows,
  ].join('\n');
}

async function main(): Promise<void> {
  const workload = arg('workload', 'rl');
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-bench-serving-'));
  try {
    const modelDir = path.join(tmp, 'model');
    const name = arg('model', workload === 'rl' ? 'small' : 'tiny');
    if (!MODELS[name]) throw new Error(`--model: unknown '${name}' (known: ${Object.keys(MODELS).join(', ')})`);
    const created = createModel({ ...MODELS[name]!, seed: 0, out: modelDir });
    const table = workload === 'rl' ? await rlWorkload(modelDir, tmp) : await capacityWorkload(modelDir, tmp);
    process.stdout.write(
      `Machine: ${os.cpus().length} x ${os.cpus()[0]!.model}; model ${name} (${(created.parameterCount / 1e6).toFixed(1)}M), ${arg('dtype', 'float32')} on ${arg('device', 'cpu')}, ${arg('threads', '2')} threads.\n\n${table}\n`,
    );
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack}\n`);
  process.exit(1);
});
