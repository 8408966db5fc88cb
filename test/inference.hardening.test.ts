/**
 * The inference server against what used to crash, hang or waste it (issue #15): non-finite
 * weights, a KV budget requests cannot fit, huge prompts, requests that overflow the queue, bad
 * settings at start. Servers run as their own processes: a crash or a blocked event loop there
 * fails a test instead of taking jest down, and every request has a deadline.
 */
/* eslint-disable @typescript-eslint/no-explicit-any -- JSON bodies of raw HTTP responses */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { loadConfig } from '../lib/config/loader';
import { WORKER_SECTIONS, WORKER_SHARED_KEYS, workerSchema } from '../lib/config/schemas';
import { createModel } from '../lib/model/create';
import { loadHfModel, writeHfModel } from '../lib/model/hf';
import { Tokenizer } from '../lib/model/tokenizer';
import { PromptWorkers } from '../lib/inference/prompts';
import { projectRoot } from '../lib/paths';
import { tinyModel } from './support/setup';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-inference-hard-'));
const baseDir = path.join(root, 'base');
const outDir = path.join(root, 'out');
const REGISTER_TS = path.join(projectRoot, 'lib', 'envs', 'register-ts.js');
const FIXTURE = path.join(projectRoot, 'test', 'fixtures', 'inference-server.ts');
/** Every request of these tests has a deadline: a hung server fails the test, it does not hang it. */
const DEADLINE_MS = 30_000;

/** A copy of the base model with every weight replaced by `value` (same shape, so update_weights takes it). */
function poisonedCopy(dir: string, value: number): void {
  const base = loadHfModel(baseDir);
  const tensors = base.tensors.map((t) => {
    const data = Buffer.alloc(t.data.length);
    new Float32Array(data.buffer, data.byteOffset, data.length / 4).fill(value);
    return { ...t, data };
  });
  writeHfModel(dir, { config: base.rawConfig, tensors, copyFrom: baseDir });
}

interface Proc {
  child: ChildProcess;
  /** The server's URL once it listens; rejects when the process exits first. */
  url: Promise<string>;
  exited: Promise<number | null>;
  stdout(): string;
  stderr(): string;
  stop(): Promise<void>;
}

function watch(child: ChildProcess): Proc {
  let out = '';
  let err = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (err += d));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const url = new Promise<string>((resolve, reject) => {
    child.stdout!.on('data', () => {
      const m = out.match(/(?:listening|on) (http:\/\/[\d.]+:\d+)/);
      if (m) resolve(m[1]);
    });
    void exited.then((code) => reject(new Error(`exited ${code} before listening: ${err}`)));
  });
  url.catch(() => undefined);
  return {
    child,
    url,
    exited,
    stdout: () => out,
    stderr: () => err,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    },
  };
}

/** A server process on `config` (through the schema) plus `unchecked` settings the schema would refuse. */
function serverProcess(config: object, unchecked?: object): Proc {
  const arg = JSON.stringify({ config, unchecked });
  return watch(
    spawn(process.execPath, ['--require', REGISTER_TS, FIXTURE, arg], { stdio: ['ignore', 'pipe', 'pipe'] }),
  );
}

function cli(args: string[], env: NodeJS.ProcessEnv = {}): Proc {
  return watch(
    spawn(process.execPath, [path.join(projectRoot, 'bin', 'prime-rl.js'), ...args], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    }),
  );
}

/** Exit code of a command that must refuse to start; a server that starts instead is stopped and fails the test. */
async function refusal(p: Proc): Promise<number | null> {
  const started = p.url.then(
    () => true,
    () => false,
  );
  const outcome = await Promise.race([
    p.exited.then(() => 'exited' as const),
    started.then((s) => (s ? ('served' as const) : ('exited' as const))),
  ]);
  if (outcome === 'served') {
    await p.stop();
    throw new Error(`it started serving instead of refusing: ${p.stdout()}`);
  }
  return p.exited;
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};
/** Waits for `cond`, checking every 50 ms; fails after DEADLINE_MS. */
async function until(cond: () => boolean): Promise<void> {
  for (const end = Date.now() + DEADLINE_MS; !cond(); await new Promise((r) => setTimeout(r, 50)))
    if (Date.now() > end) throw new Error('condition not met in time');
}

const post = (url: string, body: unknown) =>
  fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(DEADLINE_MS),
  });
const health = async (base: string) =>
  (await fetch(`${base}/health`, { signal: AbortSignal.timeout(DEADLINE_MS) })).status;

/** Server-sent events of a streaming response, read to its end. */
async function events(r: Response): Promise<string[]> {
  const text = await r.text();
  return text
    .split('\n\n')
    .filter((e) => e.startsWith('data: '))
    .map((e) => e.slice('data: '.length));
}

async function metric(base: string, name: string): Promise<number> {
  const text = await (await fetch(`${base}/metrics`, { signal: AbortSignal.timeout(DEADLINE_MS) })).text();
  const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  if (!m) throw new Error(`no metric ${name}`);
  return Number(m[1]);
}

beforeAll(() => {
  tinyModel(baseDir);
  poisonedCopy(path.join(outDir, 'nan'), NaN);
  poisonedCopy(path.join(outDir, 'inf'), Infinity);
});
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

describe('a server with max_running 2, max_queued 4', () => {
  let server: Proc;
  let base: string;
  beforeAll(async () => {
    // bfloat16: decode attention then runs through SDPA, which reads (masked) stale cache entries.
    server = serverProcess({
      model: { name: baseDir, dtype: 'bfloat16' },
      seq_len: 2048,
      output_dir: outDir,
      threads: 1,
      max_running: 2,
      max_queued: 4,
      server: { port: 0 },
    });
    base = await server.url;
  });
  afterAll(async () => {
    await server?.stop();
  });

  test('non-finite weights fail each request with a clear error; the server lives and recovers', async () => {
    const prompt = { prompt_token_ids: [1, 2, 3], max_tokens: 4 };
    const good = await post(`${base}/v1/generate`, { ...prompt, temperature: 0 });
    const before = (await good.json()) as any;
    for (const [dir, version] of [
      ['nan', 1],
      ['inf', 2],
    ] as const) {
      expect((await post(`${base}/update_weights`, { weight_dir: path.join(outDir, dir), version })).status).toBe(200);
      for (const sampling of [{ temperature: 0 }, {}, { top_p: 0.9 }, { top_k: 5 }, { min_p: 0.1 }]) {
        // Long prompts in both slots: NaN keys and values far into the cache.
        const r = await post(`${base}/v1/generate`, {
          prompt_token_ids: Array.from({ length: 60 }, (_, i) => 1 + i),
          max_tokens: 4,
          ...sampling,
          n: 2,
        });
        const body = (await r.json()) as any;
        expect([r.status, body.error.code]).toEqual([500, 'non_finite_logits']);
        expect(body.error.message).toMatch(/non-finite logits/);
        expect(body.error.message).toContain(dir); // names the weights that produce them
      }
      // A stream ends too: an error event, then [DONE].
      const r = await post(`${base}/v1/chat/completions`, {
        messages: [{ role: 'user', content: 'hi' }],
        stream: true,
        n: 2,
        top_k: 5,
        logprobs: true,
        top_logprobs: 2,
      });
      expect(r.status).toBe(200);
      const evs = await events(r);
      expect(evs[evs.length - 1]).toBe('[DONE]');
      expect(JSON.parse(evs[evs.length - 2]).error.code).toBe('non_finite_logits');
    }
    expect(await health(base)).toBe(200);
    // Good weights again: the very same answer as before the poison (no NaN left behind in the cache).
    expect((await post(`${base}/reload_weights`, {})).status).toBe(200);
    const after = (await (await post(`${base}/v1/generate`, { ...prompt, temperature: 0 })).json()) as any;
    expect(after.choices).toEqual(before.choices);
    // A short and a long sequence together: the short one's slot is masked beyond its length, not
    // free of what the poisoned sequences left there.
    const both = await Promise.all(
      [prompt.prompt_token_ids, Array.from({ length: 40 }, (_, i) => 1 + i)].map((ids) =>
        post(`${base}/v1/generate`, { prompt_token_ids: ids, max_tokens: 8, seed: 1 }),
      ),
    );
    expect(both.map((r) => r.status)).toEqual([200, 200]);
  });

  test('/reload_weights reads the base weights from disk (no copy kept in memory)', async () => {
    const moved = `${baseDir}.moved`;
    fs.renameSync(baseDir, moved);
    try {
      const r = await post(`${base}/reload_weights`, {});
      const body = (await r.json()) as any;
      expect([r.status, body.error.code]).toEqual([500, 'base_model_unreadable']);
      expect(body.error.message).toContain(baseDir);
    } finally {
      fs.renameSync(moved, baseDir);
    }
    expect((await post(`${base}/reload_weights`, {})).status).toBe(200);
  });

  test('a request that can never be queued is a 400 before any stream starts, and runs nothing', async () => {
    const tokens = await metric(base, 'prime_inference_prompt_tokens_total');
    const stream = await post(`${base}/v1/chat/completions`, {
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 8,
      n: 8,
      stream: true,
    });
    expect(stream.status).toBe(400);
    expect(stream.headers.get('content-type')).toMatch(/application\/json/);
    const body = (await stream.json()) as any;
    expect(body.error.param).toBe('n');
    expect(body.error.message).toMatch(/max_queued 4/);
    // 64 prompts x n 64: refused whole, nothing generated for it.
    const big = await post(`${base}/v1/completions`, {
      prompt: Array.from({ length: 64 }, (_, i) => [1 + i, 2]),
      n: 64,
      max_tokens: 16,
    });
    expect(big.status).toBe(400);
    expect(await metric(base, 'prime_inference_prompt_tokens_total')).toBe(tokens);
  });

  test('a 429 is all or nothing: none of the refused request runs', async () => {
    const tokens = await metric(base, 'prime_inference_prompt_tokens_total');
    // 2 running + 4 waiting, each for 1000 tokens: the queue stays full for a while.
    const busy = post(`${base}/v1/completions`, {
      prompt: [1, 2, 3, 4, 5, 6, 7],
      n: 6,
      max_tokens: 1000,
      ignore_eos: true,
      seed: 1,
    });
    while ((await metric(base, 'prime_inference_running_sequences')) < 2) await new Promise((r) => setTimeout(r, 10));
    const refused = await post(`${base}/v1/completions`, {
      prompt: [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]],
      n: 3,
      max_tokens: 4,
    });
    expect(refused.status).toBe(429);
    expect(((await refused.json()) as any).error.code).toBe('queue_full');
    const streamed = await post(`${base}/v1/chat/completions`, {
      messages: [{ role: 'user', content: 'hi' }],
      n: 3,
      stream: true,
    });
    expect(streamed.status).toBe(429);
    expect((await busy).status).toBe(200);
    // Only the busy request's 6 x 7 prompt tokens were ever prefilled.
    expect(await metric(base, 'prime_inference_prompt_tokens_total')).toBe(tokens + 42);
  });

  test('a weight folder whose config.json claims 10^7 blocks is a 400 naming the field and the bytes; the server keeps serving', async () => {
    // It used to crash the server: V8 heap out of memory (exit 134) while listing 10^8 tensors.
    const dir = path.join(outDir, 'deep');
    const model = loadHfModel(baseDir);
    writeHfModel(dir, { config: model.rawConfig, tensors: model.tensors, copyFrom: baseDir });
    fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify({ ...model.rawConfig, num_hidden_layers: 1e7 }));
    const r = await post(`${base}/update_weights`, { weight_dir: dir, version: 7 });
    const body = (await r.json()) as any;
    expect([r.status, body.error.param, body.error.code]).toEqual([400, 'weight_dir', 'invalid_model']);
    expect(body.error.message).toMatch(
      /config\.json: field 'num_hidden_layers' \(10000000\) makes [\d,]+ parameters: at least [\d.]+ GiB of weights, but the folder's weight files hold [\d.]+ KiB/,
    );
    // Of the same size but another model: the field that differs, before any weight is read.
    fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify({ ...model.rawConfig, rms_norm_eps: 1e-5 }));
    const other = (await (await post(`${base}/update_weights`, { weight_dir: dir, version: 7 })).json()) as any;
    expect(other.error.message).toMatch(
      /config\.json: field 'rms_norm_eps' is 0\.00001, the served model has 0\.000001$/,
    );
    expect(await health(base)).toBe(200);
    expect((await post(`${base}/v1/generate`, { prompt_token_ids: [1, 2], max_tokens: 2 })).status).toBe(200);
  });

  test('every weight-folder refusal is the same 403, whether the path exists, is outside, or links out; a hard link out says what was found', async () => {
    const secret = path.join(root, 'secret');
    fs.mkdirSync(secret, { recursive: true });
    // A file outside the roots that the loader would read without complaint: only the check can stop it.
    fs.copyFileSync(path.join(baseDir, 'model.safetensors'), path.join(secret, 'model.safetensors'));
    const linked = (name: string, link: (target: string, at: string) => void) => {
      const dir = path.join(outDir, name);
      fs.mkdirSync(dir, { recursive: true });
      for (const f of fs.readdirSync(baseDir))
        if (f !== 'model.safetensors') fs.copyFileSync(path.join(baseDir, f), path.join(dir, f));
      link(path.join(secret, 'model.safetensors'), path.join(dir, 'model.safetensors'));
      return dir;
    };
    const hard = linked('hard', fs.linkSync);
    const soft = linked('soft', fs.symlinkSync);
    const cases = [
      [path.join(secret, 'nope'), path.join(secret, 'nope')], // outside, absent
      [secret, secret], // outside, present
      [path.join(outDir, 'nope'), path.join(outDir, 'nope')], // inside, absent
      [soft, path.join(soft, 'model.safetensors')],
    ];
    const answers = new Set<string>();
    for (const [dir, named] of cases) {
      const r = await post(`${base}/update_weights`, { weight_dir: dir, version: 9 });
      const body = (await r.json()) as any;
      expect(body.error.message.startsWith(`weight_dir: ${named} `)).toBe(true);
      answers.add(JSON.stringify([r.status, { ...body.error, message: body.error.message.replace(named, '<path>') }]));
    }
    expect([...answers]).toEqual([
      JSON.stringify([
        403,
        {
          message: `weight_dir: <path> is outside the allowed roots (${outDir}) or does not exist; a file linked from outside them counts as outside`,
          type: 'permission_error',
          param: 'weight_dir',
          code: 'forbidden_path',
        },
      ]),
    ]);
    // A name inside the roots for a file whose other name is outside: refused, saying so.
    const r = await post(`${base}/update_weights`, { weight_dir: hard, version: 9 });
    expect([r.status, ((await r.json()) as any).error]).toEqual([
      403,
      {
        message: `weight_dir: ${path.join(hard, 'model.safetensors')} has 2 names (hard links), 1 of them inside the allowed roots (${outDir}): another name may be a file from outside them; copy the file, or link it from inside the roots`,
        type: 'permission_error',
        param: 'weight_dir',
        code: 'forbidden_path',
      },
    ]);
    expect(await health(base)).toBe(200);
  });

  test('checkpoint trees of hard links inside the roots load (cp -al, rsync --link-dest)', async () => {
    // Refused before as "outside the allowed roots or does not exist", whatever their names.
    const ckpt = path.join(outDir, 'ckpt');
    const step1 = path.join(ckpt, 'step_1');
    fs.mkdirSync(ckpt, { recursive: true });
    fs.cpSync(baseDir, step1, { recursive: true });
    // cp -al: every file of step_2 another name of step_1's.
    const step2 = path.join(ckpt, 'step_2');
    expect(spawnSync('cp', ['-al', step1, step2]).status).toBe(0);
    // rsync --link-dest=step_1: files unchanged since step_1 linked to its, the others new.
    const step3 = path.join(ckpt, 'step_3');
    fs.mkdirSync(step3);
    for (const f of fs.readdirSync(step1))
      if (f === 'model.safetensors') fs.copyFileSync(path.join(baseDir, f), path.join(step3, f));
      else fs.linkSync(path.join(step1, f), path.join(step3, f));
    for (const [dir, version] of [
      [step2, 12],
      [step3, 13],
    ] as const) {
      const r = await post(`${base}/update_weights`, { weight_dir: dir, version });
      expect([r.status, ((await r.json()) as any).weight_dir]).toEqual([200, dir]);
    }
    expect((await post(`${base}/reload_weights`, {})).status).toBe(200);
  });

  test('a non-streamed response beyond server.max_response_entries is a 400 naming the fields, before anything runs', async () => {
    // n 64 x 2,000 tokens x 21 logprob entries held /health for 8.5 s while the body was built.
    const tokens = await metric(base, 'prime_inference_prompt_tokens_total');
    const chat = await post(`${base}/v1/chat/completions`, {
      messages: [{ role: 'user', content: 'hi' }],
      n: 64,
      max_tokens: 2000,
      logprobs: true,
      top_logprobs: 20,
    });
    const chatError = ((await chat.json()) as any).error;
    expect([chat.status, chatError.param, chatError.code]).toEqual([400, 'max_tokens', 'response_too_large']);
    expect(chatError.message).toBe(
      'max_tokens: n x max_tokens x (1 + top_logprobs) = 2688000 entries in one response, more than server.max_response_entries (1048576); ask for fewer, or stream the response',
    );
    const completion = await post(`${base}/v1/completions`, {
      prompt: Array.from({ length: 8 }, () => [1, 2]),
      n: 8,
      max_tokens: 1000,
      logprobs: 20,
    });
    const completionError = ((await completion.json()) as any).error;
    expect([completion.status, completionError.code]).toEqual([400, 'response_too_large']);
    expect(completionError.message).toMatch(
      /^max_tokens: prompts x n x \(max_tokens x \(1 \+ logprobs\) \+ echoed prompt tokens\) = 1344000 entries/,
    );
    expect(await metric(base, 'prime_inference_prompt_tokens_total')).toBe(tokens); // nothing ran
  });

  test('a prompt far beyond the context is refused without tokenizing it', async () => {
    const huge = 'x'.repeat(10 * 1024 * 1024);
    const c = await post(`${base}/v1/completions`, { prompt: huge, max_tokens: 1 });
    const cBody = (await c.json()) as any;
    expect([c.status, cBody.error.param, cBody.error.code]).toEqual([400, 'prompt', 'context_length_exceeded']);
    // "at least": the count is a bound from the bytes, not a tokenization of 10 MB.
    expect(cBody.error.message).toMatch(/at least \d+ tokens/);
    const chat = await post(`${base}/v1/chat/completions`, { messages: [{ role: 'user', content: huge }] });
    const chatBody = (await chat.json()) as any;
    expect([chat.status, chatBody.error.param]).toEqual([400, 'messages']);
    expect(chatBody.error.message).toMatch(/at least \d+ tokens/);
    expect(await health(base)).toBe(200);
  });
});

describe('a KV budget too small for a request', () => {
  test('is refused at start: exit 2 naming kv_cache_tokens (inference and the inference worker)', async () => {
    const direct = cli([
      'inference',
      '--model.name',
      baseDir,
      '--seq-len',
      '256',
      '--server.port',
      '0',
      '--kv-cache-tokens',
      '100',
    ]);
    expect(await refusal(direct)).toBe(2);
    expect(direct.stderr()).toMatch(/kv_cache_tokens/);
    const worker = cli([
      'worker',
      '--pool',
      'inference',
      '--inference.model.name',
      baseDir,
      '--inference.seq-len',
      '256',
      '--inference.server.port',
      '0',
      '--inference.kv-cache-tokens',
      '100',
    ]);
    expect(await refusal(worker)).toBe(2);
    expect(worker.stderr()).toMatch(/kv_cache_tokens/);
  });

  test('a request that does not fit is a 400 naming kv_cache_tokens; the server stays responsive', async () => {
    // A budget the schema refuses, forced in: the scheduler itself must never spin on it.
    const server = serverProcess(
      { model: { name: baseDir }, seq_len: 256, output_dir: outDir, threads: 1, server: { port: 0 } },
      { kv_cache_tokens: 100 },
    );
    try {
      const base = await server.url;
      const r = await post(`${base}/v1/generate`, { prompt_token_ids: [1, 2, 3], max_tokens: 200 });
      const body = (await r.json()) as any;
      expect([r.status, body.error.code]).toEqual([400, 'kv_cache_exceeded']);
      expect(body.error.message).toMatch(/kv_cache_tokens 100/);
      expect(await health(base)).toBe(200);
      const fits = await post(`${base}/v1/generate`, { prompt_token_ids: [1, 2, 3], max_tokens: 20 });
      expect(fits.status).toBe(200);
    } finally {
      await server.stop();
    }
    expect(server.child.signalCode).toBeNull(); // SIGTERM was enough
  });
});

describe('settings at start', () => {
  test('an empty API key variable is exit 2 with a message, not a stack', async () => {
    for (const args of [
      ['inference', '--model.name', baseDir, '--server.port', '0', '--server.api-key-var', 'TEST_PRIME_RL_EMPTY_KEY'],
      [
        'worker',
        '--pool',
        'inference',
        '--inference.model.name',
        baseDir,
        '--inference.server.port',
        '0',
        '--inference.server.api-key-var',
        'TEST_PRIME_RL_EMPTY_KEY',
      ],
    ]) {
      const p = cli(args, { TEST_PRIME_RL_EMPTY_KEY: '' });
      expect(await refusal(p)).toBe(2);
      expect(p.stderr()).toMatch(/api_key_var.*TEST_PRIME_RL_EMPTY_KEY.*empty/);
      expect(p.stderr()).not.toMatch(/\n\s+at /);
    }
  });

  test('a model folder whose config.json or tokenizer.json would allocate without bound: exit 2 naming the field or the file', async () => {
    const folder = (name: string, edit: (dir: string) => void) => {
      const dir = path.join(root, name);
      fs.cpSync(baseDir, dir, { recursive: true });
      edit(dir);
      return dir;
    };
    const json = (file: string, change: (j: any) => void) => {
      const j = JSON.parse(fs.readFileSync(file, 'utf8'));
      change(j);
      fs.writeFileSync(file, JSON.stringify(j));
    };
    // V8 heap out of memory (exit 134) after 21 s, and a minute of start-up, before.
    const deep = folder('deep-base', (d) => json(path.join(d, 'config.json'), (c) => (c.num_hidden_layers = 1e7)));
    const bigId = folder('big-id', (d) =>
      json(path.join(d, 'tokenizer.json'), (t) => t.added_tokens.push({ id: 1e9, content: '<big>', special: true })),
    );
    for (const [dir, message] of [
      [
        deep,
        /model\.name: .*config\.json: field 'num_hidden_layers' \(10000000\) makes [\d,]+ parameters: at least [\d.]+ GiB of weights/,
      ],
      [bigId, /model\.name: .*big-id\/tokenizer\.json: token "<big>" has id 1000000000, far outside a vocabulary/],
    ] as const) {
      const p = cli(['inference', '--model.name', dir, '--server.port', '0', '--threads', '1']);
      expect(await refusal(p)).toBe(2);
      expect(p.stderr()).toMatch(message);
      expect(p.stderr()).not.toMatch(/\n\s+at /);
    }
  });

  test('worker --pool inference --output-dir X loads weights under X', async () => {
    const workerOut = path.join(root, 'worker-out');
    const step = path.join(workerOut, 'run', 'weights', 'step_1');
    tinyModel(step, { seed: 1 });
    const p = cli([
      'worker',
      '--pool',
      'inference',
      '--output-dir',
      workerOut,
      '--inference.model.name',
      baseDir,
      '--inference.seq-len',
      '256',
      '--inference.server.port',
      '0',
      '--threads',
      '1',
    ]);
    try {
      const base = await p.url;
      const r = await post(`${base}/update_weights`, { weight_dir: step, version: 1 });
      expect(r.status).toBe(200);
    } finally {
      await p.stop();
    }
  });

  test('the worker config: output_dir fills the inference section; cpu workers get none', () => {
    const shared = { keys: WORKER_SHARED_KEYS, sections: WORKER_SECTIONS };
    const load = (argv: string[]) => loadConfig({ schema: workerSchema, argv, env: {}, shared }).config;
    expect(load(['--pool', 'cpu', '--output-dir', 'X']).inference).toBeUndefined();
    const inf = load(['--pool', 'inference', '--output-dir', 'X', '--threads', '3', '--inference.model.name', 'm']);
    expect([inf.inference?.output_dir, inf.inference?.threads]).toEqual(['X', 3]);
    expect(() =>
      load(['--pool', 'inference', '--output-dir', 'X', '--inference.output-dir', 'Y', '--inference.model.name', 'm']),
    ).toThrow(/output_dir/);
  });
});

describe('a server on a Qwen3 tokenizer with a long context', () => {
  const qwenDir = path.join(root, 'qwen');
  let server: Proc;
  let base: string;
  beforeAll(async () => {
    // A long context, so that a prompt of a megabyte passes the byte bound and must be tokenized.
    createModel({
      arch: 'qwen3',
      preset: 'tiny',
      tokenizer: 'qwen3',
      seed: 0,
      out: qwenDir,
      maxPositionEmbeddings: 32768,
    });
    server = serverProcess({
      model: { name: qwenDir },
      seq_len: 32768,
      output_dir: outDir,
      threads: 1,
      max_running: 1,
      server: { port: 0 },
      cpu_cache_mb: 8,
    });
    base = await server.url;
  });
  afterAll(async () => {
    await server?.stop();
  });

  test('a long prompt is tokenized off the event loop', async () => {
    const words = ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta', 'eta', 'theta'];
    let text = '';
    for (let i = 0; text.length < 1_000_000; i++) text += `${words[(i * 7919) % 8]}${i % 13 === 0 ? '.\n' : ' '}`;
    const tokenizer = Tokenizer.fromDir(qwenDir);
    expect(tokenizer.minTokens(text)).toBeLessThan(32768); // the byte bound lets it through: it must be tokenized
    const prompts = new PromptWorkers(tokenizer, qwenDir, { processes: 1, timeoutMs: 600_000, heapMb: 1024 });
    try {
      // Were the tokenization on this thread, no timer could fire before it is done.
      let ticks = 0;
      const timer = setInterval(() => ticks++, 1);
      const outcome = await prompts.encode(text).finally(() => clearInterval(timer));
      expect(ticks).toBeGreaterThan(0);
      expect('ids' in outcome && outcome.ids.length).toBeGreaterThan(32768); // (the next test compares ids with the inline tokenizer)
    } finally {
      await prompts.close();
    }
  });

  test('the server tokenizes a long prompt in a helper process, with the same ids, /health answering', async () => {
    const text = 'The quick brown fox. '.repeat(400);
    const r = await post(`${base}/v1/completions`, { prompt: text, max_tokens: 1, return_token_ids: true });
    expect(r.status).toBe(200);
    const body = (await r.json()) as any;
    expect(body.choices[0].prompt_token_ids).toEqual(Tokenizer.fromDir(qwenDir).encode(text));
    // Over the bound is refused at once; under it but over the context, after tokenizing.
    const over = await post(`${base}/v1/completions`, { prompt: 'alpha beta '.repeat(30_000), max_tokens: 1 });
    expect(((await over.json()) as any).error.message).toMatch(/the prompt has \d+ tokens/);
    expect(await health(base)).toBe(200);
  });

  test("the engine's cache of freed blocks stays within inference.cpu_cache_mb, however many shapes requests have", async () => {
    // Unbounded by the server, it held up to 2 GiB after a fuzzing pass (prompts of every length
    // free logits blocks of every size).
    for (let length = 2; length < 60; length += 3)
      expect(
        (
          await post(`${base}/v1/generate`, {
            prompt_token_ids: Array.from({ length }, (_, i) => 100 + i),
            max_tokens: 2,
            prompt_logprobs: true, // logits of every prompt position: [length, 151,936] floats
          })
        ).status,
      ).toBe(200);
    const cached = await metric(base, 'prime_inference_cpu_cache_bytes');
    expect(cached).toBeGreaterThan(0);
    expect(cached).toBeLessThanOrEqual(8 * 2 ** 20);
    expect(await metric(base, 'prime_inference_resident_bytes')).toBeGreaterThan(cached);
  });

  test('n > 10 raises no MaxListeners warning', async () => {
    const r = await post(`${base}/v1/chat/completions`, {
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 2,
      n: 16,
    });
    expect(((await r.json()) as any).choices).toHaveLength(16);
    expect(await health(base)).toBe(200); // the warning would be on stderr by now
    expect(server.stderr()).not.toMatch(/MaxListeners/);
  });
});

describe('a model folder whose chat template loops or renders megabytes', () => {
  const dir = path.join(root, 'hostile-template');
  const template = path.join(dir, 'chat_template.jinja');
  let server: Proc;
  let base: string;
  beforeAll(async () => {
    fs.cpSync(baseDir, dir, { recursive: true });
    // Harmless for most chats; hostile for the one whose first message asks for it.
    fs.writeFileSync(
      template,
      `{%- set c = messages[0].content -%}
{%- if c == 'loop' -%}{%- for i in range(100000) -%}{%- for j in range(100000) -%}{%- endfor -%}{%- endfor -%}
{%- elif c == 'big' -%}{%- set ns = namespace(s='x') -%}{%- for i in range(26) -%}{%- set ns.s = ns.s + ns.s -%}{%- endfor -%}{{ ns.s }}
{%- elif c == 'hog' -%}{%- for i in range(30000000) -%}{%- endfor -%}
{%- elif c == 'huge' -%}{%- for i in range(1000000000) -%}{%- endfor -%}
{%- endif -%}
{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor -%}<|im_start|>assistant\n`,
    );
    server = serverProcess({
      model: { name: dir },
      seq_len: 2048,
      output_dir: outDir,
      threads: 1,
      server: { port: 0, prompt_timeout_s: 5, prompt_heap_mb: 128 },
    });
    base = await server.url;
  });
  afterAll(async () => {
    await server?.stop();
  });

  const chat = (content: string, extra: object = {}) =>
    post(`${base}/v1/chat/completions`, { messages: [{ role: 'user', content }], max_tokens: 2, ...extra });

  test('a template that loops is stopped at its time limit: a 400 naming it, /health and other chats answer meanwhile', async () => {
    // It used to run on the event loop: /health timed out and the server never answered again.
    const finished: string[] = [];
    const looping = chat('loop').then(async (r) => {
      finished.push('loop');
      return [r.status, ((await r.json()) as any).error] as const;
    });
    const others = Promise.all([health(base), chat('hello')]).then(([h, r]) => {
      finished.push('others');
      return [h, r.status];
    });
    expect(await others).toEqual([200, 200]);
    const [status, error] = await looping;
    expect(finished).toEqual(['others', 'loop']);
    expect(status).toBe(400);
    expect(error).toMatchObject({ param: 'messages', code: 'chat_template_timeout' });
    expect(error.message).toBe(
      `messages: the chat template (${template}) did not finish within 5 s (server.prompt_timeout_s) and was stopped`,
    );
    // Its thread was replaced: chats render as before.
    expect((await chat('hello again')).status).toBe(200);
  });

  test('a template that renders megabytes, or allocates beyond its heap (range(30000000) crashed the server), gets a 400 naming it', async () => {
    const big = await chat('big');
    expect([big.status, ((await big.json()) as any).error]).toEqual([
      400,
      expect.objectContaining({
        code: 'chat_template_output_too_large',
        message: expect.stringMatching(
          new RegExp(
            `^messages: the chat template \\(${template}\\) rendered 671\\d{5} characters, more than the 33554432 a prompt may have$`,
          ),
        ),
      }),
    ]);
    const hog = await chat('hog');
    expect([hog.status, ((await hog.json()) as any).error]).toEqual([
      400,
      expect.objectContaining({
        code: 'chat_template_out_of_memory',
        message: `messages: the chat template (${template}) needed more than the 128 MiB a prompt's helper process may use (server.prompt_heap_mb) and was stopped`,
      }),
    ]);
    expect(await health(base)).toBe(200);
    expect((await chat('hello')).status).toBe(200);
  });

  test('a template whose one allocation is larger than V8 makes at all is out of memory too, not a helper crash', async () => {
    // range(1000000000) under the default 1 GiB heap: V8's "invalid size error" (SIGTRAP), which
    // the server answered with a 500 quoting a native frame address.
    const prompts = new PromptWorkers(Tokenizer.fromDir(dir), dir, { processes: 1, timeoutMs: 300_000, heapMb: 1024 });
    try {
      const outcome = await prompts.chat(
        [{ role: 'user', content: 'huge' }],
        { addGenerationPrompt: true },
        { maxChars: 1 << 20, contextLength: 2048 },
      );
      expect(outcome).toEqual({ refused: 'memory' });
    } finally {
      await prompts.close();
    }
  });

  test('a chat nested thousands deep is a 400 naming the field; the 40 chats around it all answer', async () => {
    // 3,000 deep it overflowed the stack of the prompt supervisor's IPC deserializer: the supervisor
    // died, and every chat in flight with it (25 of 40) got a 500.
    let deep: unknown = 'x';
    for (let i = 0; i < 3000; i++) deep = { a: deep };
    const ordinary = (i: number) => chat(`hello ${i}`).then((r) => r.status);
    const before = Array.from({ length: 20 }, (_, i) => ordinary(i));
    const bad = post(`${base}/v1/chat/completions`, {
      messages: [{ role: 'user', content: 'x', extra: deep }],
      max_tokens: 2,
    });
    const after = Array.from({ length: 20 }, (_, i) => ordinary(20 + i));
    const r = await bad;
    expect([r.status, ((await r.json()) as any).error]).toEqual([
      400,
      {
        message:
          'messages.0.extra.a.a.a...: nests deeper than 64 levels (objects and arrays inside each other), more than a request may',
        type: 'invalid_request_error',
        param: 'messages.0.extra.a.a.a',
        code: 'too_deep',
      },
    ]);
    expect(await Promise.all([...before, ...after])).toEqual(Array(40).fill(200));
    // Wherever a body nests: tool parameters, template arguments, any route.
    for (const [route, body, param] of [
      [
        '/v1/chat/completions',
        { messages: [{ role: 'user', content: 'x' }], chat_template_kwargs: { k: deep } },
        'chat_template_kwargs.k.a.a.a.a',
      ],
      [
        '/v1/chat/completions',
        {
          messages: [{ role: 'user', content: 'x' }],
          tools: [{ type: 'function', function: { name: 'f', parameters: deep } }],
        },
        'tools.0.function.parameters.a.a',
      ],
      ['/v1/generate', { prompt_token_ids: [1], extra: deep }, 'extra.a.a.a.a.a'],
      ['/update_weights', { weight_dir: deep }, 'weight_dir.a.a.a.a.a'],
    ] as const) {
      const refused = await post(`${base}${route}`, body);
      expect([refused.status, ((await refused.json()) as any).error.param]).toEqual([400, param]);
    }
  });

  test('a prompt supervisor that dies is replaced, its tasks in flight handed to the next one; a helper that dies fails its own task alone', async () => {
    const children = (pid: number) =>
      spawnSync('pgrep', ['-P', String(pid)], { encoding: 'utf8' })
        .stdout.split('\n')
        .filter(Boolean)
        .map(Number);
    const supervisor = children(server.child.pid!)[0];
    expect(supervisor).toBeDefined();
    // Both helpers busy with a template that loops, ten chats waiting for them: killed, the
    // supervisor failed every one of them (500).
    const loops = [chat('loop'), chat('loop')];
    await until(() => children(supervisor).length === 2);
    const waiting = Array.from({ length: 10 }, (_, i) => chat(`waiting ${i}`));
    process.kill(supervisor, 'SIGKILL');
    await until(() => !alive(supervisor));
    expect((await Promise.all(waiting)).map((r) => r.status)).toEqual(Array(10).fill(200));
    for (const r of await Promise.all(loops))
      expect([r.status, ((await r.json()) as any).error.code]).toEqual([400, 'chat_template_timeout']);
    expect((await chat('after')).status).toBe(200);
    // A helper that dies of anything but its task's appetite: a 500 for that task alone, naming the
    // signal and nothing of the helper's last words.
    const next = children(server.child.pid!)[0];
    const looping = chat('loop');
    // The helper running it is the one computing (state R in /proc); an idle one sleeps.
    const running = (pid: number) => {
      try {
        return fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].startsWith('R');
      } catch {
        return false; // gone meanwhile
      }
    };
    let helper: number | undefined;
    await until(() => (helper = children(next).find(running)) !== undefined);
    const beside = chat('beside');
    process.kill(helper!, 'SIGSEGV');
    const died = await looping;
    expect([died.status, ((await died.json()) as any).error]).toEqual([
      500,
      {
        message: 'internal error: prompt worker exited (SIGSEGV) while running this request',
        type: 'server_error',
        param: null,
        code: 'prompt_worker_failed',
      },
    ]);
    expect((await beside).status).toBe(200);
    expect(server.stderr()).toMatch(/\[prompt helper\] exited \(SIGSEGV\) while running a task/);
    // A server of its own, killed: its supervisor and helpers exit with it (their IPC channels close).
    const doomed = serverProcess({
      model: { name: dir },
      seq_len: 256,
      output_dir: outDir,
      threads: 1,
      server: { port: 0 },
    });
    const url = await doomed.url;
    const r = await post(`${url}/v1/chat/completions`, { messages: [{ role: 'user', content: 'x' }], max_tokens: 1 });
    expect(r.status).toBe(200);
    const sup = children(doomed.child.pid!);
    const helpers = sup.flatMap(children);
    expect([sup.length, helpers.length]).toEqual([1, 1]);
    doomed.child.kill('SIGKILL');
    await doomed.exited;
    await until(() => [...sup, ...helpers].every((p) => !alive(p)));
  });

  test('a chat that cannot fit the context is refused before it is rendered', async () => {
    // 140,000 one-letter messages blocked /health for 5 s while the template rendered them.
    const many = Array.from({ length: 140_000 }, () => ({ role: 'user', content: 'a' }));
    const r = await post(`${base}/v1/chat/completions`, { messages: many, max_tokens: 2 });
    const body = (await r.json()) as any;
    expect([r.status, body.error.param, body.error.code]).toEqual([400, 'messages', 'context_length_exceeded']);
    expect(body.error.message).toBe(
      "messages: 140000 messages cannot fit this model's context of 2048 tokens (each renders to at least one token)",
    );
    // Few messages, but their contents alone are more tokens than the context (at least 10000 / 16,
    // the longest token of this tokenizer, each).
    const long = Array.from({ length: 4 }, () => ({ role: 'user', content: 'b'.repeat(10_000) }));
    const r2 = await post(`${base}/v1/chat/completions`, { messages: long, max_tokens: 2 });
    expect(((await r2.json()) as any).error.message).toMatch(/^messages: the prompt has at least 2500 tokens/);
  });
});
