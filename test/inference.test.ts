/** The inference server on a tiny model, driven by the official `openai` client and raw HTTP. */
/* eslint-disable @typescript-eslint/no-explicit-any -- JSON bodies of raw HTTP responses */
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import OpenAI from 'openai';
import { loadModel } from '../lib/model/engine';
import { inferenceSchema } from '../lib/config/schemas';
import { startInferenceServer, type InferenceServer } from '../lib/inference/server';
import { createTinyMoe } from './support/tiny-moe';
import { loadHfModel } from '../lib/model/hf';
import { projectRoot } from '../lib/paths';
import { startServer } from './support/harness';
import { Tokenizer } from '../lib/model/tokenizer';
import { tinyModel } from './support/setup';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-inference-'));
const baseDir = path.join(root, 'base');
const otherDir = path.join(root, 'out', 'step_1');
const wideDir = path.join(root, 'out', 'wide');
let server: InferenceServer;
let client: OpenAI;

beforeAll(async () => {
  tinyModel(baseDir);
  tinyModel(otherDir, { seed: 1 });
  tinyModel(wideDir, { hiddenSize: 96 });
  const config = inferenceSchema.parse({
    model: { name: baseDir },
    seq_len: 256,
    output_dir: path.join(root, 'out'),
    threads: 2,
    // Short header timeout: the slow-client test waits for it.
    server: { port: 0, headers_timeout_s: 1, request_timeout_s: 30 },
    max_running: 16,
  });
  server = await startInferenceServer(config);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused' });
});
afterAll(async () => {
  await server?.close(1000);
  fs.rmSync(root, { recursive: true, force: true });
});

const post = (route: string, body: unknown, headers: Record<string, string> = {}) =>
  fetch(`${server.url}${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
const generate = async (body: object): Promise<any> => (await post('/v1/generate', body)).json() as any;
const chat = { model: '' as string, messages: [{ role: 'user' as const, content: 'Reverse: abc' }] };

beforeAll(() => {
  chat.model = baseDir;
});

describe('OpenAI API', () => {
  test('GET /v1/models', async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual([baseDir]);
  });

  test('chat completion, and seeds reproduce', async () => {
    const a = await client.chat.completions.create({ ...chat, max_tokens: 12, seed: 7 });
    const b = await client.chat.completions.create({ ...chat, max_tokens: 12, seed: 7 });
    expect(a.object).toBe('chat.completion');
    expect(a.choices[0].message.role).toBe('assistant');
    expect(a.usage?.completion_tokens).toBeGreaterThan(0);
    expect(a.choices[0].message.content).toBe(b.choices[0].message.content);
    expect((a as unknown as { policy_version: number }).policy_version).toBe(0);
  });

  test('streaming chat delivers the same text as non-streaming', async () => {
    const whole = await client.chat.completions.create({ ...chat, max_tokens: 16, seed: 3 });
    const stream = await client.chat.completions.create({
      ...chat,
      max_tokens: 16,
      seed: 3,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let finish: string | null = null;
    let usage;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
      usage = chunk.usage ?? usage;
    }
    expect(text).toBe(whole.choices[0].message.content);
    expect(finish).toBe(whole.choices[0].finish_reason);
    expect(usage?.completion_tokens).toBe(whole.usage?.completion_tokens);
  });

  test('n > 1 gives distinct samples; temperature 0 is greedy and deterministic', async () => {
    const r = await client.chat.completions.create({ ...chat, max_tokens: 16, n: 4, seed: 1 });
    expect(r.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    expect(new Set(r.choices.map((c) => c.message.content)).size).toBeGreaterThan(1);
    const g = await client.chat.completions.create({ ...chat, max_tokens: 8, n: 2, temperature: 0 });
    expect(g.choices[0].message.content).toBe(g.choices[1].message.content);
  });

  test('completions with text and with token ids', async () => {
    const a = await client.completions.create({ model: baseDir, prompt: 'hello', max_tokens: 6, seed: 2 });
    expect(a.choices[0].text.length).toBeGreaterThan(0);
    const ids = [...Buffer.from('hello')];
    const b = await client.completions.create({ model: baseDir, prompt: ids, max_tokens: 6, seed: 2 });
    expect(b.choices[0].text).toBe(a.choices[0].text);
  });

  test('stop strings cut the text', async () => {
    const free = await client.completions.create({ model: baseDir, prompt: 'x', max_tokens: 24, seed: 11 });
    const text = free.choices[0].text;
    const stop = text.slice(5, 7);
    const cut = await client.completions.create({ model: baseDir, prompt: 'x', max_tokens: 24, seed: 11, stop });
    expect(cut.choices[0].text).toBe(text.slice(0, text.indexOf(stop)));
    expect(cut.choices[0].finish_reason).toBe('stop');
  });

  test('logprobs equal the engine scoring the same tokens', async () => {
    const r = await post('/v1/chat/completions', {
      ...chat,
      max_tokens: 10,
      seed: 5,
      temperature: 0.7,
      logprobs: true,
      return_token_ids: true,
    });
    const body = (await r.json()) as any;
    const prompt: number[] = body.prompt_token_ids;
    const completion: number[] = body.choices[0].token_ids;
    const logprobs: number[] = body.choices[0].logprobs.content.map((c: { logprob: number }) => c.logprob);
    expect(logprobs).toHaveLength(completion.length);
    const hf = loadHfModel(baseDir);
    const model = await loadModel(hf.config, hf.tensors);
    const ids = [...prompt, ...completion];
    const [scores] = await model.score([{ inputIds: ids, positionIds: ids.map((_, i) => i) }], { temperature: 0.7 });
    const expected = Array.from(scores.logprobs.slice(prompt.length));
    logprobs.forEach((lp, i) => expect(lp).toBeCloseTo(expected[i], 4));
  });

  test('top_logprobs: k alternatives, sorted, the greedy choice first', async () => {
    const r = await client.chat.completions.create({
      ...chat,
      max_tokens: 6,
      temperature: 0,
      logprobs: true,
      top_logprobs: 3,
    });
    const content = r.choices[0].logprobs!.content!;
    expect(content).toHaveLength(r.usage!.completion_tokens);
    for (const entry of content) {
      expect(entry.top_logprobs).toHaveLength(3);
      const lps = entry.top_logprobs.map((t) => t.logprob);
      expect([...lps].sort((a, b) => b - a)).toEqual(lps);
      expect(entry.top_logprobs[0].logprob).toBeCloseTo(entry.logprob, 6);
    }
    const c = await client.completions.create({
      model: baseDir,
      prompt: 'ab',
      max_tokens: 3,
      temperature: 0,
      logprobs: 2,
    });
    for (const alts of c.choices[0].logprobs!.top_logprobs!) expect(Object.keys(alts).length).toBeGreaterThanOrEqual(1);
  });

  test("echo: the prompt comes first, with the logprobs /v1/generate's prompt_logprobs gives its tokens", async () => {
    const prompt = 'Reverse: abc';
    const ids = [...Buffer.from(prompt)]; // the bytes tokenizer: one token per byte
    const reference = await generate({ prompt_token_ids: ids, max_tokens: 1, prompt_logprobs: true });
    const request = { prompt: ids, max_tokens: 3, seed: 4, logprobs: 0, n: 2 };
    const plain = (await (await post('/v1/completions', request)).json()) as any;
    const echoed = (await (await post('/v1/completions', { ...request, echo: true })).json()) as any;
    expect(echoed.policy_version).toBe(reference.policy_version);
    expect(echoed.choices).toHaveLength(2);
    for (const c of echoed.choices) {
      const lp = c.logprobs;
      // The prompt's tokens with the engine's prompt logprobs (the first: null), then the completion.
      // (Close, not equal: the n prompts are prefilled in one pack, a matmul of another shape.)
      expect(lp.token_logprobs[0]).toBeNull();
      lp.token_logprobs
        .slice(1, ids.length)
        .forEach((x: number, i: number) => expect(x).toBeCloseTo(reference.prompt_logprobs[i + 1], 5));
      expect(lp.tokens.slice(0, ids.length)).toEqual([...prompt]);
      expect(lp.token_logprobs).toHaveLength(ids.length + 3);
      expect(lp.tokens).toHaveLength(ids.length + 3);
      expect(lp.top_logprobs).toBeNull();
      // text_offset: where each token starts in the text.
      expect(c.text.startsWith(prompt)).toBe(true);
      expect(lp.text_offset).toHaveLength(ids.length + 3);
      lp.tokens.forEach((t: string, i: number) => {
        if (i < ids.length) expect(c.text.slice(lp.text_offset[i], lp.text_offset[i] + t.length)).toBe(t);
        if (i > 0) expect(lp.text_offset[i]).toBe(lp.text_offset[i - 1] + lp.tokens[i - 1].length);
      });
      expect(lp.text_offset[ids.length]).toBe(prompt.length);
    }
    // Echo changes what is returned, not what is generated (the same request without echo).
    echoed.choices.forEach((c: any, i: number) => {
      expect(c.text).toBe(prompt + plain.choices[i].text);
      expect(c.logprobs.token_logprobs.slice(ids.length)).toEqual(plain.choices[i].logprobs.token_logprobs);
      expect(c.logprobs.tokens.slice(ids.length)).toEqual(plain.choices[i].logprobs.tokens);
    });
    expect(echoed.usage).toEqual({
      prompt_tokens: 2 * ids.length,
      completion_tokens: 6,
      total_tokens: 2 * ids.length + 6,
    });
  });

  test('echo with max_tokens 0: the prompt alone, from text or token ids; without logprobs, text only', async () => {
    const prompt = 'Reverse: abc';
    const ids = [...Buffer.from(prompt)];
    const reference = await generate({ prompt_token_ids: ids, max_tokens: 1, prompt_logprobs: true });
    for (const p of [prompt, ids]) {
      const r = (await (
        await post('/v1/completions', { prompt: p, max_tokens: 0, echo: true, logprobs: 0 })
      ).json()) as any;
      const [c] = r.choices;
      expect(c.text).toBe(prompt);
      expect(c.finish_reason).toBe('length');
      expect(c.logprobs.token_logprobs).toEqual(reference.prompt_logprobs);
      expect(c.logprobs.tokens).toEqual([...prompt]);
      expect(c.logprobs.text_offset).toEqual(ids.map((_, i) => i));
      expect(r.usage).toEqual({ prompt_tokens: ids.length, completion_tokens: 0, total_tokens: ids.length });
    }
    const bare = (await (await post('/v1/completions', { prompt, max_tokens: 2, echo: true })).json()) as any;
    expect(bare.choices[0].text.startsWith(prompt)).toBe(true);
    expect(bare.choices[0].logprobs).toBeNull();
  });

  test('64 concurrent requests all complete', async () => {
    const results = await Promise.all(
      Array.from({ length: 64 }, (_, i) => client.chat.completions.create({ ...chat, max_tokens: 8, seed: i })),
    );
    expect(results.every((r) => r.choices[0].finish_reason === 'length' || r.choices[0].finish_reason === 'stop')).toBe(
      true,
    );
    expect(server.scheduler.runningCount).toBe(0);
  });
});

describe('/v1/generate', () => {
  test('token in, token out, with prompt logprobs', async () => {
    const body = await generate({
      prompt_token_ids: [10, 20, 30, 40],
      max_tokens: 5,
      seed: 9,
      n: 2,
      prompt_logprobs: true,
    });
    expect(body.prompt_token_ids).toEqual([10, 20, 30, 40]);
    expect(body.choices).toHaveLength(2);
    for (const c of body.choices) {
      expect(c.token_ids).toHaveLength(5);
      expect(c.logprobs).toHaveLength(5);
      expect(c.finish_reason).toBe('length');
    }
    expect(body.prompt_logprobs).toHaveLength(4);
    expect(body.prompt_logprobs[0]).toBeNull();
    expect(body.usage).toEqual({ prompt_tokens: 4, completion_tokens: 10, total_tokens: 14 });
    const again = await generate({ prompt_token_ids: [10, 20, 30, 40], max_tokens: 5, seed: 9, n: 2 });
    expect(again.choices.map((c: { token_ids: number[] }) => c.token_ids)).toEqual(
      body.choices.map((c: { token_ids: number[] }) => c.token_ids),
    );
  });
});

describe('a Qwen3-MoE model (sparse blocks 0 and 2, dense block 1)', () => {
  const moeDir = path.join(root, 'moe');
  let moeServer: InferenceServer;
  beforeAll(async () => {
    createTinyMoe(moeDir);
    moeServer = await startServer(root, {
      modelDir: moeDir,
      seqLen: 64,
      settings: { output_dir: path.join(root, 'out'), threads: 2 },
    });
  });
  afterAll(() => moeServer?.close(1000));

  test('chat completions: batched samples whose logprobs equal the engine scoring them; streaming gives the same text', async () => {
    const request = { model: moeDir, messages: chat.messages, max_tokens: 10, n: 2, seed: 5, temperature: 0.7 };
    const res = await fetch(`${moeServer.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...request, logprobs: true, return_token_ids: true }),
    });
    expect(res.status).toBe(200);
    const body = (await res.json()) as any;
    expect(body.object).toBe('chat.completion');
    expect(body.choices).toHaveLength(2);
    const hf = loadHfModel(moeDir);
    const model = await loadModel(hf.config, hf.tensors);
    const prompt: number[] = body.prompt_token_ids;
    for (const choice of body.choices) {
      expect(choice.message.role).toBe('assistant');
      const completion: number[] = choice.token_ids;
      expect(completion.length).toBeGreaterThan(0);
      const logprobs: number[] = choice.logprobs.content.map((c: { logprob: number }) => c.logprob);
      expect(logprobs).toHaveLength(completion.length);
      // Decoded with the KV cache beside another sequence, scored here as one packed row.
      const ids = [...prompt, ...completion];
      const [scores] = await model.score([{ inputIds: ids, positionIds: ids.map((_, i) => i) }], { temperature: 0.7 });
      logprobs.forEach((lp, i) => expect(lp).toBeCloseTo(scores.logprobs[prompt.length + i], 4));
    }
    expect(body.choices[0].token_ids).not.toEqual(body.choices[1].token_ids);

    const moeClient = new OpenAI({ baseURL: `${moeServer.url}/v1`, apiKey: 'unused' });
    const whole = await moeClient.chat.completions.create({ ...request, n: 1 });
    const stream = await moeClient.chat.completions.create({ ...request, n: 1, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe(whole.choices[0].message.content);
  });

  test('/v1/generate with routes: per prompt token and per sampled token, replayable by the trainer; a 400 on a dense model', async () => {
    const prompt = [10, 20, 30, 40];
    const res = await fetch(`${moeServer.url}/v1/generate`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt_token_ids: prompt, max_tokens: 6, seed: 3, return_routes: true }),
    });
    const body = (await res.json()) as any;
    expect(body.prompt_routes).toHaveLength(prompt.length - 1);
    const [choice] = body.choices;
    expect(choice.routes).toHaveLength(choice.token_ids.length);
    const all: number[][] = [...body.prompt_routes, ...choice.routes];
    // Each sparse layer's K = 2 experts: distinct ids of its 8 experts.
    const layerOk = (e: number[]) => e.every((x) => Number.isInteger(x) && x >= 0 && x < 8) && e[0] !== e[1];
    expect(all.every((r) => r.length === 4 && layerOk(r.slice(0, 2)) && layerOk(r.slice(2)))).toBe(true);
    // Training on the sample through these routes reproduces the server's logprobs.
    const hf = loadHfModel(moeDir);
    const trainer = (await loadModel(hf.config, hf.tensors)).createTrainer();
    const ids = [...prompt, ...choice.token_ids];
    const stats = await trainer.gradients(
      [
        {
          inputIds: ids,
          positionIds: ids.map((_, i) => i),
          lossMask: ids.map((_, i) => (i >= prompt.length ? 1 : 0)),
          advantages: ids.map(() => 1),
          inferenceLogprobs: [...prompt.map(() => 0), ...choice.logprobs],
          routes: [...all.flat(), -1, -1, -1, -1],
        },
      ],
      { kind: 'grpo' },
    );
    expect(stats.metrics.mismatch_kl).toBeLessThan(1e-9);
    const dense = await post('/v1/generate', { prompt_token_ids: [1, 2], max_tokens: 1, return_routes: true });
    expect(dense.status).toBe(400);
    expect(((await dense.json()) as any).error).toMatchObject({ param: 'return_routes', message: /has no MoE router/ });
  });
});

describe('weights', () => {
  const request = { prompt_token_ids: [1, 2, 3], max_tokens: 8, temperature: 0 };

  test('update_weights changes outputs and version; reload_weights restores them', async () => {
    const before = await generate(request);
    const upd = (await (await post('/update_weights', { weight_dir: otherDir, version: 1 })).json()) as any;
    expect(upd).toMatchObject({ status: 'ok', policy_version: 1 });
    const after = await generate(request);
    expect(after.policy_version).toBe(1);
    expect(after.choices[0].logprobs).not.toEqual(before.choices[0].logprobs);
    const health = (await (await fetch(`${server.url}/health`)).json()) as any;
    expect(health).toMatchObject({ status: 'ok', policy_version: 1 });
    const rel = (await (await post('/reload_weights', {})).json()) as any;
    expect(rel.policy_version).toBe(0);
    const restored = await generate(request);
    expect(restored.choices[0]).toEqual(before.choices[0]);
    expect(restored.policy_version).toBe(0);
  });

  test('an update during generation takes effect between steps and loses no request', async () => {
    const running = Promise.all(
      Array.from({ length: 8 }, (_, i) => generate({ prompt_token_ids: [5, 6], max_tokens: 60, seed: i })),
    );
    await new Promise((r) => setTimeout(r, 20));
    await post('/update_weights', { weight_dir: otherDir });
    const results = await running;
    for (const r of results) expect(['length', 'stop']).toContain(r.choices[0].finish_reason);
    // Sequences that were running when the update landed finished under the new policy.
    expect(results.some((r) => r.policy_version === 1)).toBe(true);
    // Each token names the version that sampled it: versions never go down within a sequence, and
    // the sequences that were decoding when the update landed carry both (an in-flight update).
    for (const r of results) {
      const v: number[] = r.choices[0].policy_versions;
      expect(v).toHaveLength(r.choices[0].token_ids.length);
      expect(v.every((x) => x === 0 || x === 1) && v.every((x, i) => i === 0 || x >= v[i - 1])).toBe(true);
    }
    expect(
      results.some((r) => r.choices[0].policy_versions.includes(0) && r.choices[0].policy_versions.includes(1)),
    ).toBe(true);
    await post('/reload_weights', {});
  });
});

describe("sampling: OpenAI's penalties and logit bias, vLLM's min_tokens and ignore_eos, on every route", () => {
  const eos = () => Tokenizer.fromDir(baseDir).eosTokenIds[0];

  test('/v1/generate: ignore_eos and min_tokens hold the stop tokens back, a logit bias pulls one', async () => {
    // EOS pulled up by 100: it ends the sequence at once, unless held back (they were refused here).
    const pulled = { prompt_token_ids: [1, 2], max_tokens: 6, temperature: 0, logit_bias: { [eos()]: 100 } };
    const [plain, ignoring, held] = await Promise.all([
      generate(pulled),
      generate({ ...pulled, ignore_eos: true }),
      generate({ ...pulled, min_tokens: 3 }),
    ]);
    expect(plain.choices[0]).toMatchObject({ token_ids: [eos()], finish_reason: 'stop' });
    expect(ignoring.choices[0]).toMatchObject({ token_ids: Array(6).fill(eos()), finish_reason: 'length' });
    expect(held.choices[0].token_ids).toHaveLength(4);
    expect(held.choices[0].token_ids.slice(0, 3)).not.toContain(eos());
    expect(held.choices[0]).toMatchObject({ finish_reason: 'stop' });
    // The logprob is of the distribution sampled from: with a bias of 100, ~0.
    expect(plain.choices[0].logprobs[0]).toBeGreaterThan(-1e-3);
  });

  test('penalties: a greedy repeat gives way; the chat, completions and vLLM routes take them too', async () => {
    const tok = 7;
    const base = {
      prompt_token_ids: [1, 2],
      max_tokens: 8,
      temperature: 0,
      ignore_eos: true,
      logit_bias: { [tok]: 8 },
    };
    const [free, penalized] = await Promise.all([
      generate(base),
      generate({ ...base, presence_penalty: 2, frequency_penalty: 2 }),
    ]);
    expect(free.choices[0].token_ids).toEqual(Array(8).fill(tok));
    // 8 - 2 - 2c falls below the others after a few repeats: other tokens follow.
    const ids: number[] = penalized.choices[0].token_ids;
    expect(ids[0]).toBe(tok);
    expect(ids.filter((t) => t === tok).length).toBeLessThan(8);
    const sampling = {
      max_tokens: 8,
      temperature: 0,
      logit_bias: { [tok]: 8 },
      presence_penalty: 2,
      frequency_penalty: 2,
      ignore_eos: true,
    };
    const completion = (await (
      await post('/v1/completions', { prompt: [1, 2], ...sampling, return_token_ids: true })
    ).json()) as any;
    expect(completion.choices[0].token_ids).toEqual(ids);
    const renderer = (await (
      await post('/inference/v1/generate', { token_ids: [1, 2], sampling_params: { ...sampling, min_tokens: 2 } })
    ).json()) as any;
    expect(renderer.choices[0].token_ids).toEqual(ids);
    const chatted = await post('/v1/chat/completions', { ...chat, ...sampling, return_token_ids: true });
    expect(chatted.status).toBe(200);
    expect(((await chatted.json()) as any).choices[0].token_ids[0]).toBe(tok);
  });
});

describe('weight updates on the OpenAI routes', () => {
  test("a completion that spans a weight update names the oldest and newest version of its tokens; a stream, each token's", async () => {
    // They reported only the version served at the end (64 of 128 such requests mixed two).
    const long = { max_tokens: 200, ignore_eos: true, seed: 1 };
    const stream = await post('/v1/chat/completions', { ...chat, ...long, stream: true });
    const completion = post('/v1/completions', { prompt: [5, 6, 7], ...long, n: 2 });
    const chatted = post('/v1/chat/completions', { ...chat, ...long });
    // Ten tokens into the stream (the others decode beside it), the weights change.
    const reader = stream.body!.getReader();
    const decoder = new TextDecoder();
    const versions: number[] = [];
    let pending = '';
    let updated: Promise<Response> | undefined;
    for (let read = await reader.read(); !read.done; read = await reader.read()) {
      pending += decoder.decode(read.value, { stream: true });
      const events = pending.split('\n\n');
      pending = events.pop()!;
      for (const e of events) {
        if (!e.startsWith('data: {')) continue;
        const c = JSON.parse(e.slice('data: '.length));
        if (c.choices[0]?.delta?.content) versions.push(c.policy_version);
      }
      if (versions.length >= 10) updated ??= post('/update_weights', { weight_dir: otherDir, version: 1 });
    }
    expect((await updated!).status).toBe(200);
    expect(versions[0]).toBe(0);
    expect(versions[versions.length - 1]).toBe(1);
    expect(versions.every((v, i) => i === 0 || v >= versions[i - 1])).toBe(true);
    const c = (await (await completion).json()) as any;
    expect(c.choices.map((x: any) => x.policy_version_range)).toEqual([
      [0, 1],
      [0, 1],
    ]);
    expect(c.policy_version).toBe(1); // the version served when it finished
    // A chat rendered by a prompt helper may have started before or after the update.
    const [lo, hi] = ((await (await chatted).json()) as any).choices[0].policy_version_range;
    expect(lo <= hi && [0, 1].includes(lo) && hi === 1).toBe(true);
    await post('/reload_weights', {});
  });
});

describe('weight updates: paths and versions', () => {
  test('a config.json linked to a file outside the roots is refused, and no error quotes a file', async () => {
    const secret = path.join(root, 'secret.txt');
    fs.writeFileSync(secret, 'TOPSECRET-0123456789 do not show me\n');
    // A folder inside the roots whose config.json is a link to the secret.
    const linked = path.join(root, 'out', 'linked');
    fs.mkdirSync(linked, { recursive: true });
    fs.copyFileSync(path.join(otherDir, 'model.safetensors'), path.join(linked, 'model.safetensors'));
    fs.symlinkSync(secret, path.join(linked, 'config.json'));
    const r = await post('/update_weights', { weight_dir: linked });
    const text = await r.text();
    expect(r.status).toBe(403);
    expect(JSON.parse(text).error.param).toBe('weight_dir');
    expect(text).not.toContain('TOPSECRET');
    // A config.json inside the roots that is not JSON: the error says where, never what.
    const broken = path.join(root, 'out', 'broken');
    fs.mkdirSync(broken, { recursive: true });
    fs.writeFileSync(path.join(broken, 'config.json'), 'TOPSECRET-0123456789 do not show me\n');
    const b = await post('/update_weights', { weight_dir: broken });
    const bText = await b.text();
    expect(b.status).toBe(400);
    expect(bText).toContain('not valid JSON');
    expect(bText).not.toContain('TOPSECRET');
  });

  test('a version label names one set of weights; 0 is the base model', async () => {
    const third = path.join(root, 'out', 'step_b');
    tinyModel(third, { seed: 2 });
    const zero = await post('/update_weights', { weight_dir: otherDir, version: 0 });
    expect(zero.status).toBe(400);
    expect(((await zero.json()) as any).error.param).toBe('version');
    expect((await post('/update_weights', { weight_dir: otherDir, version: 3 })).status).toBe(200);
    // The same weights under another label, another folder under the same label: refused.
    for (const body of [
      { weight_dir: otherDir, version: 2 },
      { weight_dir: third, version: 3 },
    ]) {
      const r = await post('/update_weights', body);
      expect(r.status).toBe(409);
      expect(((await r.json()) as any).error.param).toBe('version');
    }
    // A lower label for other weights is fine (rl samples with step n - 1 after evaluating step n),
    // and so is a retried update.
    expect((await post('/update_weights', { weight_dir: third, version: 2 })).status).toBe(200);
    expect((await post('/update_weights', { weight_dir: otherDir, version: 3 })).status).toBe(200);
    // A reload starts a new lineage.
    expect((await post('/reload_weights', {})).status).toBe(200);
    expect((await post('/update_weights', { weight_dir: third, version: 3 })).status).toBe(200);
    expect((await post('/reload_weights', {})).status).toBe(200);
    // Sent together, two folders under one new label: weight changes run one at a time (the
    // weights are read without blocking the event loop), so exactly one gets the label.
    const together = await Promise.all([
      post('/update_weights', { weight_dir: otherDir, version: 7 }),
      post('/update_weights', { weight_dir: third, version: 7 }),
    ]);
    expect(together.map((r) => r.status).sort((a, b) => a - b)).toEqual([200, 409]);
    expect((await post('/reload_weights', {})).status).toBe(200);
  });
});

describe('clients', () => {
  test('a client that never finishes its headers is disconnected', async () => {
    const { hostname, port } = new URL(server.url);
    const socket = net.connect(Number(port), hostname);
    try {
      await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject));
      let answer = '';
      socket.on('data', (d) => (answer += d));
      const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
      // Half a request, then nothing (a slowloris): headers_timeout_s is 1 in this server.
      socket.write('POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n');
      await closed;
      expect(answer).toMatch(/^HTTP\/1\.1 408/);
      expect(JSON.parse(answer.split('\r\n\r\n')[1]).error).toMatchObject({
        message: expect.stringMatching(/server\.headers_timeout_s/),
        type: 'invalid_request_error',
        code: 'request_timeout',
      });
    } finally {
      socket.destroy();
    }
  }, 20_000);

  /** The raw answer to `request` (bytes as a client sends them), once the server closes or 5 s pass. */
  async function raw(request: string): Promise<{ status: string; headers: string; body: string }> {
    const { hostname, port } = new URL(server.url);
    const socket = net.connect(Number(port), hostname);
    let answer = '';
    socket.on('data', (d) => (answer += d));
    socket.on('error', () => undefined);
    await new Promise<void>((resolve) => {
      socket.once('close', () => resolve());
      socket.write(request);
      setTimeout(() => socket.destroy(), 5000);
    });
    const [head, ...body] = answer.split('\r\n\r\n');
    const [status, ...headers] = head.split('\r\n');
    return { status, headers: headers.join('\n').toLowerCase(), body: body.join('\r\n\r\n') };
  }

  // Each answered by Node or Fastify before any route: a body of Fastify's own shape, an empty
  // one, or (CONNECT) a dropped connection.
  test.each([
    [
      'an unknown method',
      'FOO /health HTTP/1.1\r\nHost: a\r\n\r\n',
      400,
      'malformed HTTP request: unknown HTTP method',
    ],
    ['a request line that is no HTTP', 'GARBAGE\r\n\r\n', 400, 'malformed HTTP request: unknown HTTP method'],
    [
      'headers over the limit',
      `GET /health HTTP/1.1\r\nHost: a\r\nX-Big: ${'x'.repeat(20_000)}\r\n\r\n`,
      431,
      'the request line and headers exceed 16384 bytes',
    ],
    [
      'a bad Content-Length',
      'POST /v1/generate HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n',
      400,
      'malformed HTTP request: Invalid character in Content-Length',
    ],
    [
      'Content-Length with chunked encoding',
      'POST /v1/generate HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
      400,
      "malformed HTTP request: Transfer-Encoding can't be present with Content-Length",
    ],
    [
      'a control character in a header',
      'GET /health HTTP/1.1\r\nHost: a\r\nX-A: b\x01c\r\n\r\n',
      400,
      'malformed HTTP request: Invalid header value char',
    ],
    [
      'a bad chunk',
      'POST /v1/generate HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n',
      400,
      'malformed HTTP request: Invalid character in chunk size',
    ],
    [
      'bare LF line ends',
      'GET /health HTTP/1.1\nHost: a\n\n',
      400,
      'malformed HTTP request: Expected CRLF after version',
    ],
    [
      'no Host header',
      'GET /health HTTP/1.1\r\nConnection: close\r\n\r\n',
      400,
      'an HTTP/1.1 request needs a Host header',
    ],
    [
      'a URL that cannot be decoded',
      'GET /%zz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n',
      400,
      'the URL cannot be decoded (malformed percent-encoding)',
    ],
    [
      'an Expect header other than 100-continue',
      'POST /v1/generate HTTP/1.1\r\nHost: a\r\nExpect: 102-what\r\nContent-Length: 2\r\n\r\n{}',
      417,
      'Expect: 102-what is not supported (only 100-continue)',
    ],
    ['CONNECT', 'CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n', 405, 'CONNECT is not supported: this is not a proxy'],
  ])('%s gets an OpenAI-style error', async (_name, request, status, message) => {
    const r = await raw(request);
    expect(r.status).toMatch(new RegExp(`^HTTP/1\\.1 ${status} `));
    expect(r.headers).toMatch(/^content-type: application\/json/m);
    const body = JSON.parse(r.body);
    expect(Object.keys(body)).toEqual(['error']);
    expect(body.error).toEqual({ message, type: 'invalid_request_error', param: null, code: expect.any(String) });
  });
});

describe('disconnects and metrics', () => {
  test('a client that goes away cancels its sequence', async () => {
    const ctrl = new AbortController();
    let pendingDone = false;
    const pending = post('/v1/generate', JSON.stringify({ prompt_token_ids: [1], max_tokens: 200, seed: 1 }), {})
      .catch(() => undefined)
      .finally(() => (pendingDone = true));
    // The request to abort ignores EOS (a route that accepts ignore_eos), so it cannot end by itself
    // within a few decode steps; the first one may (it stops after 98 tokens, in about 30 ms).
    const req = fetch(`${server.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: [1, 2], max_tokens: 250, seed: 2, ignore_eos: true }),
      signal: ctrl.signal,
    }).catch(() => 'aborted');
    // Abort once it holds a slot: beside the first request, or alone when the first has finished
    // before it was admitted (on a loaded machine it can be admitted late).
    while (server.scheduler.runningCount < (pendingDone ? 1 : 2)) await new Promise((r) => setTimeout(r, 5));
    ctrl.abort();
    expect(await req).toBe('aborted');
    await pending;
    while (server.scheduler.runningCount > 0) await new Promise((r) => setTimeout(r, 5));
    expect(server.scheduler.cache.blocksInUse).toBe(0);
  });

  test('GET /metrics in Prometheus format', async () => {
    const text = await (await fetch(`${server.url}/metrics`)).text();
    for (const name of [
      'prime_inference_requests_total',
      'prime_inference_running_sequences',
      'prime_inference_waiting_sequences',
      'prime_inference_kv_cache_usage',
      'prime_inference_kv_blocks_in_use',
      'prime_inference_preemptions_total',
      'prime_inference_prefix_hit_tokens_total',
      'prime_inference_policy_version',
      'prime_inference_generation_tokens_per_second',
    ])
      expect(text).toContain(name);
    expect(text).toMatch(/prime_inference_requests_total\{route="\/v1\/generate",status="200"\} \d+/);
  });
});

describe('bad input gets a 4xx with an OpenAI error body naming the field', () => {
  // [case, route, body, status, the param named, the message the client sees]
  const cases: [string, string, unknown, number, string | null, RegExp][] = [
    ['malformed JSON', '/v1/chat/completions', '{"messages": [', 400, null, /not valid JSON/],
    ['body not an object', '/v1/generate', '[1,2]', 400, null, /^request body must be a JSON object$/],
    [
      'wrong type',
      '/v1/chat/completions',
      { messages: 'hi' },
      400,
      'messages',
      /^messages: .*expected array, received string/,
    ],
    [
      'unknown role',
      '/v1/chat/completions',
      { messages: [{ role: 'wizard', content: 'x' }] },
      400,
      'messages.0.role',
      /^messages\.0\.role: .*expected one of/,
    ],
    [
      'unknown model',
      '/v1/chat/completions',
      { model: 'gpt-5', messages: [{ role: 'user', content: 'x' }] },
      404,
      'model',
      /^model 'gpt-5' does not exist; this server serves /,
    ],
    [
      'negative max_tokens',
      '/v1/chat/completions',
      { messages: [{ role: 'user', content: 'x' }], max_tokens: -1 },
      400,
      'max_tokens',
      /^max_tokens: .*>=1/,
    ],
    [
      'absurd max_tokens',
      '/v1/generate',
      { prompt_token_ids: [1], max_tokens: 1e9 },
      400,
      'max_tokens',
      /^max_tokens: 1000000000 new tokens do not fit: prompt 1 \+ 1000000000 > context 256$/,
    ],
    [
      'absurd n',
      '/v1/chat/completions',
      { messages: [{ role: 'user', content: 'x' }], n: 100000 },
      400,
      'n',
      /^n: .*<=64/,
    ],
    [
      'temperature out of range',
      '/v1/generate',
      { prompt_token_ids: [1], temperature: -1 },
      400,
      'temperature',
      /^temperature: .*>=0/,
    ],
    [
      'prompt longer than the context',
      '/v1/generate',
      { prompt_token_ids: Array(300).fill(1) },
      400,
      'prompt_token_ids',
      /^prompt_token_ids: the prompt has 300 tokens; this model's context is 256 tokens$/,
    ],
    [
      'token id outside the vocabulary',
      '/v1/generate',
      { prompt_token_ids: [1, 99999] },
      400,
      'prompt_token_ids',
      /^prompt_token_ids: token id 99999 at index 1 is outside the vocabulary/,
    ],
    ['negative token id', '/v1/completions', { prompt: [1, -3] }, 400, 'prompt', /^prompt\.1: .*>=0/],
    [
      'max_tokens 0 without echo',
      '/v1/completions',
      { prompt: [1], max_tokens: 0 },
      400,
      'max_tokens',
      /^max_tokens: 0 generates nothing; it is accepted only with echo: true$/,
    ],
    [
      'echo with top logprobs',
      '/v1/completions',
      { prompt: [1, 2], echo: true, logprobs: 2 },
      400,
      'logprobs',
      /^logprobs: 2 top logprobs of the echoed prompt tokens are not supported; with echo use logprobs: 0$/,
    ],
    [
      'echo with stream',
      '/v1/completions',
      { prompt: [1, 2], echo: true, stream: true },
      400,
      'stream',
      /^stream: streaming is supported on \/v1\/chat\/completions only$/,
    ],
    [
      'unknown field on /v1/generate',
      '/v1/generate',
      { prompt_token_ids: [1], temprature: 1 },
      400,
      null,
      /^unknown field\(s\) temprature$/,
    ],
    [
      'unsupported penalty',
      '/v1/chat/completions',
      { messages: [{ role: 'user', content: 'x' }], repetition_penalty: 1.1 },
      400,
      'repetition_penalty',
      /^repetition_penalty: repetition_penalty other than 1 is not supported$/,
    ],
    [
      'a penalty out of range',
      '/v1/generate',
      { prompt_token_ids: [1], presence_penalty: 2.5 },
      400,
      'presence_penalty',
      /^presence_penalty: /,
    ],
    [
      'a logit bias for a token outside the vocabulary',
      '/v1/completions',
      { prompt: [1], logit_bias: { '100000': 5 } },
      400,
      'logit_bias',
      /^logit_bias: token id 100000 is outside the vocabulary \(size \d+\)$/,
    ],
    [
      'a logit bias keyed by something else than a token id',
      '/v1/chat/completions',
      { messages: [{ role: 'user', content: 'x' }], logit_bias: { hello: 5 } },
      400,
      'logit_bias.hello',
      /logit_bias keys are token ids/,
    ],
    [
      'a logit bias out of range',
      '/v1/generate',
      { prompt_token_ids: [1], logit_bias: { '5': 101 } },
      400,
      'logit_bias.5',
      /^logit_bias\.5: /,
    ],
    [
      'min_tokens beyond max_tokens',
      '/v1/generate',
      { prompt_token_ids: [1], max_tokens: 4, min_tokens: 5 },
      400,
      'min_tokens',
      /^min_tokens: 5 is more than the 4 tokens the request may make/,
    ],
    // A path that does not exist gets the very answer of one outside the roots (whether a path
    // exists is nothing a client may learn).
    [
      'weight_dir that does not exist',
      '/update_weights',
      { weight_dir: path.join(root, 'out', 'nope') },
      403,
      'weight_dir',
      /^weight_dir: .*nope is outside the allowed roots \(.*\) or does not exist; /,
    ],
    [
      'weight_dir outside the allowed roots',
      '/update_weights',
      { weight_dir: baseDir },
      403,
      'weight_dir',
      /^weight_dir: .* is outside the allowed roots \(.*\) or does not exist; /,
    ],
    [
      'weight_dir of another shape',
      '/update_weights',
      { weight_dir: wideDir },
      400,
      'weight_dir',
      /^weight_dir: not the same model shape: .*wide\/config\.json: field 'hidden_size' is 96, the served model has 64$/,
    ],
    [
      'weight_dir not a model',
      '/update_weights',
      { weight_dir: path.join(root, 'out') },
      400,
      'weight_dir',
      /^weight_dir: not a loadable model folder: /,
    ],
  ];
  test.each(cases)('%s', async (_name, route, body, status, param, message) => {
    const r = await post(route, body);
    expect(r.status).toBe(status);
    const json = (await r.json()) as any;
    expect(json.error.message).toMatch(message);
    expect(json.error.type).toBe(
      ({ 403: 'permission_error', 404: 'not_found_error' } as Record<number, string>)[status] ??
        'invalid_request_error',
    );
    if (param) expect(json.error.param === param || json.error.param.startsWith(`${param}.`)).toBe(true);
  });

  test('oversized body is 413', async () => {
    const r = await post('/v1/generate', { prompt_token_ids: [1], pad: 'x'.repeat(17 * 1024 * 1024) });
    expect(r.status).toBe(413);
    expect(((await r.json()) as any).error).toMatchObject({
      message: expect.stringMatching(/too large/i),
      type: 'invalid_request_error',
    });
  });

  test('unknown route is 404', async () => {
    const r = await post('/v1/nothing', {});
    expect(r.status).toBe(404);
    expect(((await r.json()) as any).error.type).toBe('not_found_error');
  });

  test('the server still serves after all of the above', async () => {
    const body = await generate({ prompt_token_ids: [1], max_tokens: 2 });
    expect(body.choices[0].token_ids).toHaveLength(2);
  });
});

describe('as a process', () => {
  function startCli(env: NodeJS.ProcessEnv, extra: string[] = []) {
    const child = spawn(
      process.execPath,
      [
        path.join(projectRoot, 'bin', 'prime-rl.js'),
        'inference',
        '--model.name',
        baseDir,
        '--server.port',
        '0',
        '--seq-len',
        '256',
        ...extra,
      ],
      { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const url = new Promise<string>((resolve, reject) => {
      let out = '';
      child.stdout.on('data', (d) => {
        out += d;
        const m = out.match(/on (http:\/\/[\d.]+:\d+)/);
        if (m) resolve(m[1]);
      });
      child.once('exit', (code) => reject(new Error(`exited ${code}`)));
    });
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    return { child, url, exited };
  }

  test('with an API key, requests without the bearer token get 401', async () => {
    const { child, url, exited } = startCli({ TEST_INFERENCE_KEY: 'sekrit' }, [
      '--server.api-key-var',
      'TEST_INFERENCE_KEY',
    ]);
    const base = await url;
    const denied = await fetch(`${base}/v1/models`);
    expect(denied.status).toBe(401);
    expect(((await denied.json()) as any).error.type).toBe('authentication_error');
    for (const authorization of ['Bearer sekriT', 'Bearer sekrit2', 'Bearer ', 'sekrit']) {
      expect((await fetch(`${base}/v1/models`, { headers: { authorization } })).status).toBe(401);
    }
    // The key is checked before the body is read: a malformed body without the key is a 401, not a 400.
    const early = await fetch(`${base}/v1/generate`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"prompt_token_ids": [',
    });
    expect(early.status).toBe(401);
    const ok = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'sekrit' });
    expect((await ok.models.list()).data).toHaveLength(1);
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
  });

  test('SIGTERM finishes running requests, then exits 0', async () => {
    const { child, url, exited } = startCli({});
    const base = await url;
    const running = fetch(`${base}/v1/generate`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt_token_ids: [1, 2, 3], max_tokens: 100, seed: 1 }),
    }).then((r) => r.json() as Promise<any>);
    await new Promise((r) => setTimeout(r, 100));
    child.kill('SIGTERM');
    const body = await running;
    expect(['length', 'stop']).toContain(body.choices[0].finish_reason);
    expect(body.choices[0].token_ids.length).toBeGreaterThan(10);
    expect(await exited).toBe(0);
  });
});
