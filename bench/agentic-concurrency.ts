/**
 * Adaptive concurrency (lib/orchestrator/concurrency.ts) against fixed max_inflight values on an
 * agentic multi-turn workload: episodes of several turns, each turn a request that extends the
 * episode's context by the tokens the model sampled and then an environment observation (as a
 * tool result would), a mix of long episodes (many turns) and short ones, all played through the
 * orchestrator's own client (lib/orchestrator/client.ts, `/v1/generate`) against `prime-rl
 * inference` in a process of its own, whose KV cache is smaller than every episode at once needs.
 * Each policy runs on a fresh server; per policy: wall time, sampled tokens per second, episodes
 * per second, the server's preemptions (prime_inference_preemptions_total) and the limit over time.
 *
 *   npm run build:ts && node dist/bench/agentic-concurrency.js [--model tiny|small] [--episodes 48]
 *     [--long-share 0.25] [--long-turns 8] [--short-turns 2] [--turn-tokens 24] [--obs-tokens 16]
 *     [--prompt-len 64] [--kv-tokens 4096] [--max-running 64] [--fixed 4,16,64] [--threads 2]
 *     [--repeats 1] [--trace FILE]
 *
 * --trace writes one JSON line per reading of the servers: the policy, the seconds since its
 * start, the limit, the episodes in flight and the servers' counters (what held the limit).
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { mapAdaptive } from '../lib/orchestrator/adaptive';
import { InferenceClient } from '../lib/orchestrator/client';
import { ConcurrencyController, type ConcurrencyBounds } from '../lib/orchestrator/concurrency';
import { createModel } from '../lib/model/create';
import { Rng } from '../lib/model/rng';
import { randomTokens } from '../lib/model/testing';
import { serverMetric, startServerProcess } from './server-process';

const ROOT = path.resolve(__dirname, '..', '..');

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}
const num = (name: string, dflt: number) => Number(arg(name, String(dflt)));

const startServer = (modelDir: string, tmp: string, flags: string[]) =>
  startServerProcess(ROOT, modelDir, tmp, flags, { threads: arg('threads', '2') });
const metric = serverMetric;

/** One episode: its first prompt, its turns, and the observation tokens after each turn. */
interface Episode {
  prompt: number[];
  turns: number;
  observations: number[][];
}

function episodes(vocab: number): Episode[] {
  const rng = new Rng(7);
  const n = num('episodes', 48);
  const longShare = num('long-share', 0.25);
  return Array.from({ length: n }, (_, i) => {
    // Long ones spread over the list, as an env mix draws them.
    const long = (i * longShare) % 1 >= 1 - longShare;
    const turns = long ? num('long-turns', 8) : num('short-turns', 2);
    return {
      prompt: randomTokens(rng, num('prompt-len', 64), vocab),
      turns,
      observations: Array.from({ length: turns }, () => randomTokens(rng, num('obs-tokens', 16), vocab)),
    };
  });
}

interface Outcome {
  policy: string;
  seconds: number;
  tokens: number;
  episodes: number;
  preemptions: number;
  limitMean: number;
  limitMax: number;
}

/** Plays every episode with `bounds` (min = max: a fixed concurrency) on a fresh server. */
async function run(policy: string, bounds: ConcurrencyBounds, modelDir: string, tmp: string): Promise<Outcome> {
  const turnTokens = num('turn-tokens', 24);
  const list = episodes(256);
  const longest = num('prompt-len', 64) + Math.max(...list.map((e) => e.turns)) * (turnTokens + num('obs-tokens', 16));
  const server = await startServer(modelDir, tmp, [
    ...['--seq-len', String(longest + 8), '--kv-cache-tokens', arg('kv-tokens', '4096')],
    ...['--max-running', arg('max-running', '64'), '--max-batched-tokens', '2048', '--max-queued', '4096'],
  ]);
  try {
    const client = new InferenceClient([`${server.url}/v1`], { timeoutMs: 3_600_000, livenessMs: 600_000 });
    const controller = new ConcurrencyController(bounds, longest + 8);
    const limits: number[] = [];
    const preempted0 = await metric(server.url, 'prime_inference_preemptions_total');
    const trace = arg('trace', '');
    let inFlight = 0;
    let tokens = 0;
    const started = performance.now();
    await mapAdaptive(
      list,
      async (e) => {
        inFlight++;
        const ids = [...e.prompt];
        for (let t = 0; t < e.turns; t++) {
          const out = await client.generate(ids, {
            temperature: 1,
            top_p: 1,
            top_k: -1,
            min_p: 0,
            max_tokens: turnTokens,
            seed: (ids.length * 131 + t) % 2 ** 31,
          });
          tokens += out.tokenIds.length;
          ids.push(...out.tokenIds, ...e.observations[t]);
        }
        inFlight--;
      },
      {
        controller,
        read: async () => {
          limits.push(controller.limit);
          const readings = await client.readings();
          if (trace) {
            const t = (performance.now() - started) / 1000;
            const line = { policy, t, limit: controller.limit, inFlight, signal: controller.signal, readings };
            fs.appendFileSync(trace, `${JSON.stringify(line)}\n`);
          }
          return readings;
        },
      },
    );
    const seconds = (performance.now() - started) / 1000;
    return {
      policy,
      seconds,
      tokens,
      episodes: list.length,
      preemptions: (await metric(server.url, 'prime_inference_preemptions_total')) - preempted0,
      limitMean: limits.reduce((a, b) => a + b, 0) / Math.max(1, limits.length),
      limitMax: Math.max(...limits),
    };
  } finally {
    await server.stop();
  }
}

async function main(): Promise<void> {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-agentic-'));
  try {
    const modelDir = path.join(tmp, 'model');
    createModel({ arch: 'qwen3', preset: arg('model', 'tiny') as 'tiny', tokenizer: 'bytes', seed: 0, out: modelDir });
    const fixed = arg('fixed', '4,16,64')
      .split(',')
      .map(Number)
      .filter((n) => n > 0);
    const policies: [string, ConcurrencyBounds][] = [
      ['adaptive', { min_inflight: 1, max_inflight: 1024 }],
      ...fixed.map((n): [string, ConcurrencyBounds] => [
        `fixed ${n}`,
        { initial_inflight: n, min_inflight: n, max_inflight: n },
      ]),
    ];
    const results: Outcome[] = [];
    // Each repeat starts at the next policy: whichever runs first runs colder.
    for (let rep = 0; rep < num('repeats', 1); rep++)
      for (const [name, bounds] of [
        ...policies.slice(rep % policies.length),
        ...policies.slice(0, rep % policies.length),
      ]) {
        const r = await run(name, bounds, modelDir, tmp);
        results.push(r);
        process.stdout.write(`${JSON.stringify(r)}\n`);
      }
    const by = (p: string) => results.filter((r) => r.policy === p);
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
    const adaptive = mean(by('adaptive').map((r) => r.tokens / r.seconds));
    process.stdout.write(
      `\n| policy | wall s | sampled tok/s | episodes/s | preemptions | limit mean / max | tok/s vs adaptive |\n| --- | --- | --- | --- | --- | --- | --- |\n`,
    );
    for (const [name] of policies) {
      const rs = by(name);
      const tps = mean(rs.map((r) => r.tokens / r.seconds));
      process.stdout.write(
        `| ${name} | ${mean(rs.map((r) => r.seconds)).toFixed(1)} | ${tps.toFixed(1)} | ${mean(rs.map((r) => r.episodes / r.seconds)).toFixed(2)} | ${mean(rs.map((r) => r.preemptions)).toFixed(0)} | ${mean(rs.map((r) => r.limitMean)).toFixed(1)} / ${Math.max(...rs.map((r) => r.limitMax))} | ${(tps / adaptive).toFixed(2)} |\n`,
      );
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

void main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
