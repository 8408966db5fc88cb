/**
 * The paged KV cache through the inference server (real HTTP, the real engine): prefix sharing of
 * n completions and of a group sent as separate requests, preemption under a small KV budget,
 * several decode steps per engine call with stop strings, a weight update while requests run, what
 * /metrics reports, and the new settings refused by name. The scenarios run on a Qwen3 model (the
 * paged KV cache alone) and on a Qwen3.5 one (a hybrid: state slots for its Gated DeltaNet blocks
 * beside the KV blocks of its attention blocks), with the same counts: a hybrid resumes a shared
 * prompt from the state snapshot at its last block boundary, where Qwen3 resumes from its blocks.
 */
/* eslint-disable @typescript-eslint/no-explicit-any -- JSON bodies of raw HTTP responses */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { inferenceSchema } from '../lib/config/schemas';
import { ConfigError } from '../lib/failures';
import { startInferenceServer, type InferenceServer } from '../lib/inference/server';
import { startServer } from './support/harness';
import { tinyModel } from './support/setup';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-inference-paged-'));
const baseDir = path.join(root, 'base');
const hybridDir = path.join(root, 'hybrid');
// update_weights reads from the server's output_dir (harness.ts: root/outputs).
const nextHybrid = path.join(root, 'outputs', 'weights', 'step_1');
const nextBase = path.join(root, 'outputs', 'weights', 'step_2');
beforeAll(() => {
  tinyModel(baseDir);
  tinyModel(hybridDir, { arch: 'qwen3_5' });
  tinyModel(nextHybrid, { arch: 'qwen3_5', seed: 1 });
  tinyModel(nextBase, { seed: 1 });
});
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

const ARCHS = [
  ['qwen3', baseDir, nextBase],
  ['qwen3_5', hybridDir, nextHybrid],
] as const;
let modelDir = baseDir; // the model of the describe block running

async function withServer<T>(settings: object, fn: (s: InferenceServer) => Promise<T>, dir = modelDir): Promise<T> {
  const server = await startServer(root, { modelDir: dir, seqLen: 256, settings: { threads: 2, ...settings } });
  try {
    return await fn(server);
  } finally {
    await server.close(1000);
  }
}

const post = async (server: InferenceServer, route: string, body: object): Promise<any> => {
  const r = await fetch(`${server.url}${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  expect(r.status).toBe(200);
  return r.json();
};

async function metric(server: InferenceServer, name: string): Promise<number> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  if (!m) throw new Error(`no metric ${name}`);
  return Number(m[1]);
}

// A group's prompt: 100 tokens (6 blocks of 16 and 4 more).
const prompt = Array.from({ length: 100 }, (_, i) => 1 + ((i * 37) % 200));
const rollout = (seed: number) => ({ prompt, max_tokens: 24, seed, ignore_eos: true });
const textsOf = (body: any): string[] => body.choices.map((c: any) => c.text);

describe.each(ARCHS)('%s', (arch, dir, nextDir) => {
  beforeAll(() => {
    modelDir = dir;
  });

  test("a group's rollouts, as n completions or as separate requests, prefill their prompt once and sample as unshared", async () => {
    const unshared = await withServer({ prefix_sharing: 'off' }, async (s) => {
      const out = await Promise.all([1, 2, 3, 4].map((seed) => post(s, '/v1/completions', rollout(seed))));
      expect(await metric(s, 'prime_inference_prefill_tokens_total')).toBe(4 * 100);
      expect(await metric(s, 'prime_inference_prefix_hit_tokens_total')).toBe(0);
      return out.flatMap(textsOf);
    });
    await withServer({}, async (s) => {
      // Separate requests sent together: one prefills, the others share its blocks as it goes.
      // (Those that come after its prefill take its six full blocks from the cache, and compute 4.)
      const apart = await Promise.all([1, 2, 3, 4].map((seed) => post(s, '/v1/completions', rollout(seed))));
      expect(apart.flatMap(textsOf)).toEqual(unshared);
      const prefilled = await metric(s, 'prime_inference_prefill_tokens_total');
      expect(prefilled).toBeGreaterThanOrEqual(100);
      expect(prefilled).toBeLessThanOrEqual(100 + 3 * 4);
      expect(await metric(s, 'prime_inference_prefix_hit_tokens_total')).toBe(4 * 100 - prefilled);
      // Later, the same prompt again: its full blocks come from the prefix cache.
      await post(s, '/v1/completions', rollout(9));
      expect(await metric(s, 'prime_inference_prefill_tokens_total')).toBe(prefilled + 4);
      expect(await metric(s, 'prime_inference_kv_blocks_in_use')).toBe(0);
      expect(await metric(s, 'prime_inference_kv_blocks_cached')).toBeGreaterThan(0);
    });
    await withServer({ prefix_sharing: 'live' }, async (s) => {
      // n completions of one request (seeds seed, seed + 1, ...): prefilled once, exactly.
      const body = await post(s, '/v1/completions', { ...rollout(1), n: 4 });
      expect(textsOf(body)).toEqual(unshared);
      expect(await metric(s, 'prime_inference_prefill_tokens_total')).toBe(100);
    });
  });

  test('a KV budget that holds one long sequence: requests are preempted and recomputed, never failed, same tokens', async () => {
    const bodies = [1, 2, 3, 4, 5, 6].map((seed) => ({
      prompt: prompt.slice(0, 20 + seed),
      max_tokens: 200,
      seed,
      ignore_eos: true,
    }));
    const roomy = await withServer({}, (s) => Promise.all(bodies.map((b) => post(s, '/v1/completions', b))));
    await withServer({ kv_cache_tokens: 256, max_running: 6 }, async (s) => {
      const tight = await Promise.all(bodies.map((b) => post(s, '/v1/completions', b)));
      expect(tight.map(textsOf)).toEqual(roomy.map(textsOf));
      expect(await metric(s, 'prime_inference_preemptions_total')).toBeGreaterThan(0);
      expect(await metric(s, 'prime_inference_kv_blocks_in_use')).toBe(0);
      expect(await metric(s, 'prime_inference_preempted_sequences')).toBe(0);
    });
  });

  test('several decode steps per engine call: the same tokens; a stop string still ends the text', async () => {
    const chat = {
      messages: [{ role: 'user', content: 'Reverse the text: decode steps' }],
      max_tokens: 40,
      seed: 3,
      temperature: 1,
    };
    const one = await withServer({}, (s) => post(s, '/v1/chat/completions', chat));
    const text: string = one.choices[0].message.content;
    const stop = text.slice(10, 12);
    await withServer({ decode_steps: 8 }, async (s) => {
      const many = await post(s, '/v1/chat/completions', chat);
      expect(many.choices[0].message.content).toBe(text);
      const stopped = await post(s, '/v1/chat/completions', { ...chat, stop: [stop] });
      expect(stopped.choices[0].message.content).toBe(text.slice(0, text.indexOf(stop)));
      expect(stopped.choices[0].finish_reason).toBe('stop');
    });
  });

  test('a weight update while requests run: they finish, and nothing cached under the old weights is reused', async () => {
    // What the new weights give, from a server started on them.
    const fresh = await withServer({}, (s) => post(s, '/v1/completions', rollout(1)), nextDir);
    await withServer({ prefix_sharing: 'cache' }, async (s) => {
      await post(s, '/v1/completions', rollout(1)); // its prompt's blocks (and state snapshot) cached
      const running = [2, 3, 4].map((seed) => post(s, '/v1/completions', { ...rollout(seed), max_tokens: 120 }));
      // Until all three decode (24 tokens came from the first request): a prompt still being
      // prefilled at the update would start over on the new weights, and be cached under them.
      while (
        (await metric(s, 'prime_inference_running_sequences')) < 3 ||
        (await metric(s, 'prime_inference_generation_tokens_total')) < 24 + 3 * 10
      )
        await new Promise((r) => setTimeout(r, 20));
      const r = await fetch(`${s.url}/update_weights`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ weight_dir: nextDir, version: 1 }),
      });
      expect(r.status).toBe(200);
      for (const body of await Promise.all(running)) expect(body.choices[0].text.length).toBeGreaterThan(0);
      const hits = await metric(s, 'prime_inference_prefix_hit_tokens_total');
      const after = await post(s, '/v1/completions', rollout(1));
      expect(textsOf(after)).toEqual(textsOf(fresh));
      expect(after.policy_version).toBe(1);
      // Its prompt was cached under the old weights only: computed whole again.
      expect(await metric(s, 'prime_inference_prefix_hit_tokens_total')).toBe(hits);
      if (arch === 'qwen3_5') expect(await metric(s, 'prime_inference_state_slots_in_use')).toBe(0);
    });
  });
});

test('the new settings are checked by name', () => {
  const parse = (extra: object) => inferenceSchema.safeParse({ model: { name: baseDir }, ...extra });
  const issue = (extra: object) => {
    const r = parse(extra);
    expect(r.success).toBe(false);
    return r.error!.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ');
  };
  expect(issue({ gpu_memory_utilization: 0.8 })).toMatch(/^gpu_memory_utilization: .*model\.device is cpu/);
  expect(
    issue({ model: { name: baseDir, device: 'cuda' }, gpu_memory_utilization: 0.8, kv_cache_tokens: 4096 }),
  ).toMatch(/^gpu_memory_utilization: set either gpu_memory_utilization or kv_cache_tokens, not both/);
  expect(issue({ model: { name: baseDir, device: 'cuda' }, gpu_memory_utilization: 1.5 })).toMatch(
    /^gpu_memory_utilization: /,
  );
  expect(issue({ max_running: 64, max_batched_tokens: 32 })).toMatch(
    /^max_batched_tokens: 32 is smaller than max_running \(64\)/,
  );
  expect(issue({ prefix_sharing: 'all' })).toMatch(/^prefix_sharing: /);
  expect(issue({ model: { name: baseDir, paged_attention_kernel: true } })).toMatch(
    /^model\.paged_attention_kernel: is a CUDA kernel, and model\.device is cpu/,
  );
  expect(issue({ block_size: 0 })).toMatch(/^block_size: /);
  expect(parse({ model: { name: baseDir, device: 'cuda' }, gpu_memory_utilization: 0.8 }).success).toBe(true);
});

test('what the engine refuses of an option is a config error naming the key that set it', async () => {
  // Past the schema (which refuses it on the CPU first), the engine names the option it refuses and
  // the server maps it to its key by that name.
  const config = inferenceSchema.parse({ model: { name: baseDir }, seq_len: 64, threads: 1, server: { port: 0 } });
  config.model.paged_attention_kernel = true;
  const refused = await startInferenceServer(config).then(
    (s) => s.close(1000).then(() => undefined),
    (e: Error) => e,
  );
  expect(refused).toBeInstanceOf(ConfigError);
  expect(refused?.message).toMatch(
    /^inference\.model\.paged_attention_kernel: (this build of the addon has no CUDA|the model is not on a CUDA device).*; leave it false$/,
  );
});
