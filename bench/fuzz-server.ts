/**
 * Fuzzes a live inference server on loopback, as an attacker and a careless client would: a few
 * thousand requests, valid ones mixed with hostile ones (malformed HTTP and JSON, prompts and chats
 * beyond the context, huge bodies, responses beyond the limit, weight folders that lie or link out,
 * clients that leave), from `--concurrency` clients at once, while `/health` is probed every 50 ms.
 *
 *   npm run build:ts && node dist/bench/fuzz-server.js [--requests 3000] [--concurrency 16] [--seed 1] [--model tiny|small] [--cpu-cache-mb N]
 *     [--server-root DIR]   (the server of another checkout, e.g. an older commit, built)
 *
 * Reports what a server must never do (5xx, connections reset or requests unanswered that the
 * client did not abort), `/health` latency percentiles under the load, the status codes, and the
 * server's resident memory before and after (the server process; its prompt helpers apart), as
 * markdown for docs/benchmarks/inference.md. The server is `prime-rl inference` in a process of its own.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { createModel } from '../lib/model/create';
import { loadHfModel, writeHfModel } from '../lib/model/hf';
import { Rng } from '../lib/model/rng';
import { freePort } from '../lib/net';
import { projectRoot } from '../lib/paths';

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}

const REQUESTS = Number(arg('requests', '3000'));
const CONCURRENCY = Number(arg('concurrency', '16'));
const SEED = Number(arg('seed', '1'));
const MODEL = arg('model', 'tiny');
/** The checkout whose `bin/prime-rl.js` serves (another version, to compare): this one by default. */
const SERVER_ROOT = arg('server-root', projectRoot);
/** The server's inference.cpu_cache_mb (unset: its default). */
const CPU_CACHE_MB = process.argv.includes('--cpu-cache-mb') ? arg('cpu-cache-mb', '') : undefined;
/** A request unanswered after this long counts as a timeout. */
const DEADLINE_MS = 60_000;
const SEQ_LEN = 512;

const percentile = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] : NaN;
};

/** Resident memory of `pid` (VmRSS), and of its descendants. */
function rss(pid: number): { own: number; children: number } {
  const of = (p: number) => {
    try {
      const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${p}/status`, 'utf8'));
      return m ? Number(m[1]) * 1024 : 0;
    } catch {
      return 0;
    }
  };
  const descendants = (p: number): number[] => {
    const kids = spawnSync('pgrep', ['-P', String(p)], { encoding: 'utf8' })
      .stdout.split('\n')
      .filter(Boolean)
      .map(Number);
    return kids.flatMap((k) => [k, ...descendants(k)]);
  };
  return { own: of(pid), children: descendants(pid).reduce((a, p) => a + of(p), 0) };
}

const MiB = (n: number) => `${(n / 2 ** 20).toFixed(0)} MiB`;

/** The server's own account of its memory (/metrics): JS heap, and the engine's cache of freed blocks. */
async function memoryMetrics(url: string): Promise<{ heap: number; cpuCache: number }> {
  const text = await fetch(`${url}/metrics`).then(
    (r) => r.text(),
    () => '', // a server that died says nothing
  );
  const read = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1] ?? NaN);
  return { heap: read('prime_inference_js_heap_bytes'), cpuCache: read('prime_inference_cpu_cache_bytes') };
}

type Outcome = { kind: 'status'; status: number } | { kind: 'reset' } | { kind: 'timeout' } | { kind: 'aborted' };

/** One HTTP request; `abortAfterMs`: the client leaves then (an expected reset). */
async function http(
  url: string,
  init: { method?: string; body?: string; headers?: Record<string, string> },
  abortAfterMs?: number,
): Promise<Outcome> {
  const ctrl = new AbortController();
  const deadline = setTimeout(() => ctrl.abort(new Error('deadline')), DEADLINE_MS);
  const leave = abortAfterMs === undefined ? undefined : setTimeout(() => ctrl.abort(new Error('leave')), abortAfterMs);
  try {
    const r = await fetch(url, {
      method: init.method ?? (init.body === undefined ? 'GET' : 'POST'),
      headers: { 'content-type': 'application/json', ...init.headers },
      body: init.body,
      signal: ctrl.signal,
    });
    await r.arrayBuffer();
    return { kind: 'status', status: r.status };
  } catch (e) {
    const why = String((ctrl.signal.reason as Error | undefined)?.message ?? '');
    if (why === 'leave') return { kind: 'aborted' };
    if (why === 'deadline') return { kind: 'timeout' };
    return { kind: 'reset' };
  } finally {
    clearTimeout(deadline);
    clearTimeout(leave);
  }
}

/** Raw bytes to the server; the status of its answer (0: none before it closed). */
function raw(port: number, bytes: string, closeAfterMs = 5000): Promise<Outcome> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let answer = '';
    s.on('data', (d) => (answer += d));
    s.on('error', () => undefined);
    s.on('close', () => {
      const m = /^HTTP\/1\.1 (\d{3})/.exec(answer);
      resolve(m ? { kind: 'status', status: Number(m[1]) } : { kind: 'reset' });
    });
    s.write(bytes);
    setTimeout(() => s.destroy(), closeAfterMs);
  });
}

async function main() {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-fuzz-'));
  const out = path.join(tmp, 'out');
  const modelDir = path.join(tmp, 'model');
  const created = createModel({
    arch: 'qwen3',
    preset: MODEL === 'small' ? 'small' : 'tiny',
    tokenizer: 'qwen3',
    seed: 0,
    out: modelDir,
    maxPositionEmbeddings: 4096,
  });
  const vocab = created.config.vocabSize;
  // Weight folders an attacker (or a broken trainer) could point /update_weights at.
  const base = loadHfModel(modelDir);
  const deep = path.join(out, 'deep');
  writeHfModel(deep, { config: base.rawConfig, tensors: base.tensors, copyFrom: modelDir });
  fs.writeFileSync(path.join(deep, 'config.json'), JSON.stringify({ ...base.rawConfig, num_hidden_layers: 1e7 }));
  const linked = path.join(out, 'linked');
  fs.cpSync(modelDir, linked, { recursive: true });
  fs.rmSync(path.join(linked, 'model.safetensors'));
  fs.copyFileSync(path.join(modelDir, 'model.safetensors'), path.join(tmp, 'outside.safetensors'));
  fs.linkSync(path.join(tmp, 'outside.safetensors'), path.join(linked, 'model.safetensors'));
  const good = path.join(out, 'good');
  fs.cpSync(modelDir, good, { recursive: true });

  const port = await freePort();
  const server: ChildProcess = spawn(
    process.execPath,
    [
      path.join(SERVER_ROOT, 'bin', 'prime-rl.js'),
      'inference',
      '--model.name',
      modelDir,
      '--server.port',
      String(port),
      '--seq-len',
      String(SEQ_LEN),
      '--output-dir',
      out,
      '--threads',
      '1',
      '--max-running',
      '16',
      '--max-queued',
      '256',
      ...(CPU_CACHE_MB === undefined ? [] : ['--cpu-cache-mb', CPU_CACHE_MB]),
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const url = `http://127.0.0.1:${port}`;
  await new Promise<void>((resolve, reject) => {
    server.stdout!.on('data', (d: Buffer) => (d.toString().includes('Serving') ? resolve() : undefined));
    server.once('exit', (code) => reject(new Error(`server exited ${code}`)));
  });
  const post = (route: string, body: unknown, abortAfterMs?: number) =>
    http(`${url}${route}`, { body: typeof body === 'string' ? body : JSON.stringify(body) }, abortAfterMs);

  const rng = new Rng(SEED, 'fuzz');
  const int = (lo: number, hi: number) => lo + Math.floor(rng.uniform() * (hi - lo + 1));
  const pick = <T>(xs: readonly T[]): T => xs[int(0, xs.length - 1)];
  const words = ['alpha', 'beta', 'gamma', 'reverse', 'the', 'text', '🎉', 'é', '<|im_start|>', '{{', '%}'];
  const text = (n: number) => Array.from({ length: n }, () => pick(words)).join(' ');
  const ids = (n: number) => Array.from({ length: n }, () => int(0, vocab - 1));
  const sampling = () => ({
    temperature: pick([0, 0.7, 1, 1.5]),
    top_p: pick([1, 0.9]),
    top_k: pick([-1, 5, 50]),
    seed: int(0, 1000),
    ...(rng.uniform() < 0.3
      ? {
          presence_penalty: pick([-1, 0.5, 2]),
          frequency_penalty: pick([-0.5, 0, 1]),
          logit_bias: { [String(int(0, vocab - 1))]: pick([-100, -2, 3, 100]) },
          min_tokens: int(0, 1),
        }
      : {}),
  });
  /**
   * JSON text of a value nested `depth` deep (objects and arrays), written directly: JSON.stringify
   * would overflow the fuzzer's own stack. Thousands killed the prompt helpers' supervisor (and every
   * chat in flight with it).
   */
  const nested = (depth: number) => {
    const opens = Array.from({ length: depth }, () => rng.uniform() < 0.5);
    return `${opens.map((o) => (o ? '{"a":' : '[')).join('')}"x"${opens
      .reverse()
      .map((o) => (o ? '}' : ']'))
      .join('')}`;
  };

  /** Requests a correct client sends: each must get a 2xx (or a 4xx it caused, e.g. too long). */
  const valid: (() => Promise<Outcome>)[] = [
    () =>
      post('/v1/chat/completions', {
        messages: Array.from({ length: int(1, 4) }, (_, i) => ({
          role: i % 2 ? 'assistant' : 'user',
          content: text(int(1, 30)),
        })),
        max_tokens: int(1, 16),
        n: int(1, 3),
        stream: rng.uniform() < 0.2,
        ...(rng.uniform() < 0.3 ? { logprobs: true, top_logprobs: int(0, 5) } : {}),
        ...sampling(),
      }),
    () =>
      post('/v1/completions', {
        prompt: rng.uniform() < 0.5 ? text(int(1, 40)) : ids(int(1, 40)),
        max_tokens: int(1, 16),
        n: int(1, 3),
        ...(rng.uniform() < 0.3 ? { logprobs: int(0, 3) } : {}),
        ...(rng.uniform() < 0.2 ? { stop: [pick(words)] } : {}),
        ...sampling(),
      }),
    () => post('/v1/completions', { prompt: ids(int(2, 30)), max_tokens: 0, echo: true, logprobs: 0 }),
    () =>
      post('/v1/generate', {
        prompt_token_ids: ids(int(1, 60)),
        max_tokens: int(1, 16),
        n: int(1, 4),
        prompt_logprobs: rng.uniform() < 0.3,
        ...sampling(),
      }),
    () => post('/inference/v1/generate', { token_ids: ids(int(1, 30)), sampling_params: { max_tokens: int(1, 8) } }),
    () => http(`${url}/v1/models`, {}),
    () => http(`${url}/metrics`, {}),
  ];
  const oversized = () => post('/v1/generate', { prompt_token_ids: [1], pad: 'p'.repeat((16 << 20) + 1) });
  const deepJson = `${'['.repeat(100_000)}${']'.repeat(100_000)}`;
  /** Requests that must be refused (4xx) or survived, never a 5xx, a reset or a hang. */
  const hostile: (() => Promise<Outcome>)[] = [
    () => post('/v1/chat/completions', '{"messages": [{"role": "user", "content": "x"}'),
    () => post('/v1/generate', { prompt_token_ids: [vocab + int(0, 1e6)], max_tokens: 2 }),
    () => post('/v1/generate', { prompt_token_ids: [-1], max_tokens: 2 }),
    () => post('/v1/generate', { prompt_token_ids: [1], max_tokens: 2, n: 1e9 }),
    () => post('/v1/generate', '{"prompt_token_ids": [1], "max_tokens": 1e400}'),
    () => post('/v1/generate', deepJson),
    () => post('/v1/chat/completions', { messages: [{ role: 'user', content: 'x'.repeat(int(1, 8) << 20) }] }),
    () =>
      post('/v1/chat/completions', {
        messages: Array.from({ length: int(1000, 140_000) }, () => ({ role: 'user', content: 'a' })),
      }),
    () => post('/v1/chat/completions', { messages: [{ role: 'user', content: text(SEQ_LEN) }], max_tokens: 8 }),
    () =>
      post('/v1/chat/completions', {
        messages: [{ role: 'user', content: 'hi' }],
        n: 64,
        max_tokens: 2000,
        logprobs: true,
        top_logprobs: 20,
      }),
    () => post('/v1/completions', { prompt: 'y'.repeat(int(1, 10) << 20), max_tokens: 1 }),
    () => post('/v1/completions', { prompt: 'x', stop: Array.from({ length: 17 }, () => 'z') }),
    () => post('/v1/completions', { prompt: [1, 2], max_tokens: 4, seed: -5, tempurature: 1 }),
    () =>
      post(
        '/v1/chat/completions',
        `{"messages": [{"role": "user", "content": "x", "extra": ${nested(int(65, 5000))}}], "max_tokens": 2}`,
      ),
    () =>
      post(
        '/v1/chat/completions',
        `{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "chat_template_kwargs": {"k": ${nested(int(1, 100))}},` +
          ` "tools": [{"type": "function", "function": {"name": "f", "parameters": ${nested(int(1, 5000))}}}]}`,
      ),
    () =>
      post(pick(['/v1/generate', '/v1/completions']), {
        [pick(['prompt_token_ids', 'prompt'])]: [1, 2],
        max_tokens: 4,
        ...pick([
          { logit_bias: { [String(vocab + int(0, 10))]: 1 } },
          { logit_bias: { '-1': 1 } },
          { logit_bias: { '5': 1000 } },
          { presence_penalty: 3 },
          { min_tokens: 5 },
          { repetition_penalty: 1.2 },
        ]),
      }),
    oversized,
    () => post('/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], model: 'gpt-5' }),
    () => post('/v1/chat/completions', { messages: [{ role: 'robot', content: 'x' }] }),
    () =>
      post('/v1/chat/completions', {
        messages: [{ role: 'user', content: 'x' }],
        tools: Array.from({ length: int(1, 5000) }, (_, i) => ({ type: 'function', function: { name: `f${i}` } })),
        max_tokens: 2,
      }),
    () => post('/update_weights', { weight_dir: pick([deep, linked, path.join(tmp, 'nope'), '/etc', '/dev/zero']) }),
    () => post('/update_weights', { weight_dir: good, version: int(1, 3) }),
    () => post('/reload_weights', {}),
    // Clients that leave: mid-generation, mid-stream (expected resets, not failures).
    () => post('/v1/generate', { prompt_token_ids: ids(20), max_tokens: 200, ignore_eos: true }, int(5, 200)),
    () =>
      post(
        '/v1/chat/completions',
        { messages: [{ role: 'user', content: 'x' }], stream: true, max_tokens: 200, ignore_eos: true },
        int(5, 200),
      ),
    // Malformed HTTP, answered by the framework.
    () => raw(port, 'FOO / HTTP/1.1\r\nHost: a\r\n\r\n'),
    () => raw(port, `GET /health HTTP/1.1\r\nHost: a\r\nX: ${'x'.repeat(20_000)}\r\n\r\n`),
    () => raw(port, 'GET /%zz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n'),
    () =>
      raw(
        port,
        'POST /v1/generate HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
      ),
    () => raw(port, 'GET /health HTTP/1.1\r\nConnection: close\r\n\r\n'),
    () => raw(port, 'CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n'),
  ];

  // A client that sends more than the body limit may see the connection close before it reads the
  // 413 (the server stops reading), and raw malformed requests may be answered by a close: resets
  // only those clients cause.
  const OVERSIZED = hostile.indexOf(oversized);
  const RAW_REQUESTS = 6;
  const health: number[] = [];
  let probing = true;
  const prober = (async () => {
    while (probing) {
      const t = performance.now();
      const o = await http(`${url}/health`, {});
      if (o.kind === 'status' && o.status === 200) health.push(performance.now() - t);
      else health.push(Infinity);
      await new Promise((r) => setTimeout(r, 50));
    }
  })();

  // Warm up (prompt helpers started, caches filled by valid traffic), then the baseline.
  for (let i = 0; i < 20; i++) await valid[i % valid.length]();
  const before = rss(server.pid!);
  const beforeMem = await memoryMetrics(url);
  const counts = new Map<string, number>();
  const failures: string[] = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < REQUESTS) {
        const n = next++;
        const isHostile = rng.uniform() < 0.4;
        const list = isHostile ? hostile : valid;
        const which = int(0, list.length - 1);
        const o = await list[which]();
        const key = o.kind === 'status' ? String(o.status) : o.kind;
        counts.set(key, (counts.get(key) ?? 0) + 1);
        if (
          (o.kind === 'status' && o.status >= 500) ||
          o.kind === 'timeout' ||
          (o.kind === 'reset' && !(isHostile && (which === OVERSIZED || which >= hostile.length - RAW_REQUESTS)))
        )
          failures.push(`#${n} ${isHostile ? 'hostile' : 'valid'}[${which}]: ${key}`);
      }
    }),
  );
  const seconds = (performance.now() - t0) / 1000;
  probing = false;
  await prober;
  const after = rss(server.pid!);
  await new Promise((r) => setTimeout(r, 5000));
  const idle = rss(server.pid!);
  const idleMem = await memoryMetrics(url);
  const alive = server.exitCode === null && server.signalCode === null;
  if (alive) {
    server.kill('SIGTERM');
    await new Promise((r) => server.once('exit', r));
  }
  fs.rmSync(tmp, { recursive: true, force: true });

  const fiveXx = [...counts].filter(([k]) => /^5/.test(k)).reduce((a, [, v]) => a + v, 0);
  const fmt = (ms: number) => (Number.isFinite(ms) ? `${ms.toFixed(1)} ms` : 'no answer');
  console.log(
    [
      `fuzz: server ${SERVER_ROOT}, ${REQUESTS} requests (40% hostile), ${CONCURRENCY} clients, seed ${SEED}, cpu_cache_mb ${CPU_CACHE_MB ?? 'default'}, model ${MODEL} (${(created.parameterCount / 1e6).toFixed(1)}M), ${seconds.toFixed(0)} s; server alive after: ${alive ? 'yes' : `no (${server.signalCode ?? `exit code ${server.exitCode}`})`}`,
      `| 5xx | resets / timeouts (not client aborts) | /health p50 | p99 | max | probes | server RSS before | after | after 5 s idle | prompt helpers RSS after |`,
      `| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |`,
      `| ${fiveXx} | ${failures.filter((f) => /reset|timeout/.test(f)).length} | ${fmt(percentile(health, 50))} | ${fmt(percentile(health, 99))} | ${fmt(Math.max(...health))} | ${health.length} | ${MiB(before.own)} | ${MiB(after.own)} | ${MiB(idle.own)} | ${MiB(after.children)} |`,
      `server JS heap ${MiB(beforeMem.heap)} -> ${MiB(idleMem.heap)}, engine cache of freed blocks ${MiB(beforeMem.cpuCache)} -> ${MiB(idleMem.cpuCache)} (before -> after 5 s idle)`,
      `status codes: ${[...counts]
        .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
        .map(([k, v]) => `${k}: ${v}`)
        .join(', ')}`,
      ...(failures.length ? [`failures (first 20): ${failures.slice(0, 20).join('; ')}`] : []),
    ].join('\n'),
  );
  if (!alive || failures.length > 0) process.exitCode = 1;
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
