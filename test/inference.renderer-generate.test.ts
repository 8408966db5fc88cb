/**
 * `POST /inference/v1/generate`, the route a verifiers env server's `renderers` client calls: its
 * request and response shape, one finite logprob per token, stop_token_ids, policy versions, errors.
 */
/* eslint-disable @typescript-eslint/no-explicit-any -- JSON bodies of raw HTTP responses */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { InferenceServer } from '../lib/inference/server';
import { startServer } from './support/harness';
import { tinyModel } from './support/setup';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-renderer-gen-'));
const baseDir = path.join(root, 'base');
const stepDir = path.join(root, 'out', 'step_1');
let server: InferenceServer;

beforeAll(async () => {
  tinyModel(baseDir);
  tinyModel(stepDir, { seed: 1 });
  server = await startServer(root, {
    modelDir: baseDir,
    seqLen: 128,
    settings: { output_dir: path.join(root, 'out'), threads: 2 },
  });
});
afterAll(async () => {
  await server?.close(1000);
  fs.rmSync(root, { recursive: true, force: true });
});

const post = async (route: string, body: unknown): Promise<{ status: number; json: any }> => {
  const res = await fetch(`${server.url}${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, json: await res.json() };
};
/** What renderers.client.generate sends (sampling_params as verifiers' SamplingConfig dumps them). */
const rendererBody = (sampling: object = {}) => ({
  model: baseDir,
  token_ids: [5, 6, 7, 8],
  sampling_params: { temperature: 1, max_tokens: 12, seed: 3, logprobs: 1, skip_special_tokens: false, ...sampling },
});

test('the response has the shape renderers.client parses: one token_id:<id> entry with a finite logprob per token', async () => {
  const { status, json } = await post('/inference/v1/generate', rendererBody());
  expect(status).toBe(200);
  expect(typeof json.request_id).toBe('string');
  expect(json.policy_version).toBe(0);
  expect(json.prompt_token_ids).toEqual([5, 6, 7, 8]);
  expect(json.choices).toHaveLength(1);
  const [choice] = json.choices;
  expect(choice.index).toBe(0);
  expect(choice.token_ids.length).toBeGreaterThan(0);
  expect(['stop', 'length']).toContain(choice.finish_reason);
  expect(choice.logprobs.content).toHaveLength(choice.token_ids.length);
  choice.logprobs.content.forEach((e: any, k: number) => {
    expect(e.token).toBe(`token_id:${choice.token_ids[k]}`);
    expect(Number.isFinite(e.logprob)).toBe(true);
    expect(e.logprob).toBeLessThanOrEqual(0);
  });
  // The same sample as our own token-in route: same engine, same seed.
  const ours = await post('/v1/generate', { prompt_token_ids: [5, 6, 7, 8], max_tokens: 12, seed: 3 });
  expect(choice.token_ids).toEqual(ours.json.choices[0].token_ids);
  expect(choice.logprobs.content.map((e: any) => e.logprob)).toEqual(ours.json.choices[0].logprobs);
});

test('stop_token_ids end the completion at that token, which is kept', async () => {
  const free = (await post('/inference/v1/generate', rendererBody({ max_tokens: 12 }))).json.choices[0];
  const stopAt = free.token_ids.findIndex((t: number, i: number) => i >= 2 && free.token_ids.indexOf(t) === i);
  expect(stopAt).toBeGreaterThanOrEqual(2); // a token first sampled at position >= 2
  const stop = free.token_ids[stopAt];
  const stopped = (await post('/inference/v1/generate', rendererBody({ max_tokens: 12, stop_token_ids: [stop] }))).json
    .choices[0];
  expect(stopped.token_ids).toEqual(free.token_ids.slice(0, stopAt + 1));
  expect(stopped.finish_reason).toBe('stop');
  expect(stopped.logprobs.content).toHaveLength(stopAt + 1);
});

test('the policy version follows /update_weights', async () => {
  expect((await post('/update_weights', { weight_dir: stepDir, version: 1 })).status).toBe(200);
  try {
    const { json } = await post('/inference/v1/generate', rendererBody());
    expect(json.policy_version).toBe(1);
    expect(json.choices[0].policy_version).toBe(1);
  } finally {
    expect((await post('/reload_weights', {})).status).toBe(200);
  }
});

test.each([
  ['no token_ids', { model: baseDir, sampling_params: {} }, 400, 'token_ids'],
  ['a token outside the vocabulary', { token_ids: [1, 99999] }, 400, 'token_ids'],
  ['another model', { model: 'gpt-x', token_ids: [1] }, 404, 'model'],
  ['an unknown sampling field', { token_ids: [1], sampling_params: { temprature: 1 } }, 400, 'sampling_params'],
  [
    'top logprobs beyond the sampled token',
    { token_ids: [1], sampling_params: { logprobs: 5 } },
    400,
    'sampling_params.logprobs',
  ],
  [
    'a repetition penalty',
    { token_ids: [1], sampling_params: { repetition_penalty: 1.2 } },
    400,
    'sampling_params.repetition_penalty',
  ],
  [
    'max_tokens past the context',
    { token_ids: [1], sampling_params: { max_tokens: 1000 } },
    400,
    'sampling_params.max_tokens',
  ],
  ['multimodal features', { token_ids: [1], features: { mm_hashes: [] } }, 400, 'features'],
])('%s: an OpenAI-style error naming the field', async (_what, body, status, param) => {
  const res = await post('/inference/v1/generate', body);
  expect(res.status).toBe(status);
  expect(res.json.error.param).toBe(param);
  expect(res.json.error.message).toContain(param === 'sampling_params' ? 'temprature' : param);
  expect(typeof res.json.error.type).toBe('string');
});
