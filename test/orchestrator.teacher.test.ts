/**
 * Online distillation's teacher (lib/orchestrator/teacher.ts) against real inference servers: the
 * teacher's logprobs of sampled tokens (one echo request per sample to /v1/completions), and the
 * start-up check that its tokenizer is the student's. A stand-in server only plays the answers our
 * server never gives (several models, a /completions that ignores echo).
 */
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as os from 'node:os';
import * as path from 'node:path';
import type { InferenceServer } from '../lib/inference/server';
import { createModel } from '../lib/model/create';
import { Tokenizer } from '../lib/model/tokenizer';
import { InferenceError } from '../lib/orchestrator/client';
import type { TokenSegment } from '../lib/runfolder/packing';
import { TeacherClient, tokenizerMismatch } from '../lib/orchestrator/teacher';
import { startServer } from './support/harness';
import { CliProcesses, inferenceProcess, settlesWithin } from './support/processes';
import { tinyModel } from './support/setup';

jest.setTimeout(120_000);

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-teacher-'));
const studentDir = path.join(root, 'student');
const otherDir = path.join(root, 'other');
let student: InferenceServer;
let other: InferenceServer;

beforeAll(async () => {
  tinyModel(studentDir);
  tinyModel(otherDir, { seed: 1 });
  [student, other] = await Promise.all([
    startServer(root, { modelDir: studentDir, seqLen: 64 }),
    startServer(root, { modelDir: otherDir, seqLen: 64 }),
  ]);
});
afterAll(async () => {
  await Promise.all([student?.close(1000), other?.close(1000)]);
  fs.rmSync(root, { recursive: true, force: true });
});

/** One sample the student generated: a prompt and up to 10 sampled tokens with their logprobs. */
async function sampled(): Promise<TokenSegment[]> {
  const res = await fetch(`${student.url}/v1/generate`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt_token_ids: [10, 20, 30], max_tokens: 10, seed: 3 }),
  });
  const c = ((await res.json()) as { choices: { token_ids: number[]; logprobs: number[] }[] }).choices[0];
  return [
    { tokens: [10, 20, 30], generated: false },
    { tokens: c.token_ids, generated: true, logprobs: c.logprobs },
  ];
}

test("the student as its own teacher gives its own logprobs (a zero distillation term); another model's differ", async () => {
  const same = await sampled();
  await new TeacherClient({ base_url: `${student.url}/v1` }).annotate([same], 64);
  const [mu, teacher] = [Array.from(same[1].logprobs!), Array.from(same[1].teacherLogprobs!) as number[]];
  expect(teacher).toHaveLength(same[1].tokens.length);
  teacher.forEach((t, i) => expect(Math.abs(t - mu[i])).toBeLessThan(1e-3));
  expect(same[0].teacherLogprobs).toBeUndefined();

  const diff = await sampled();
  await new TeacherClient({ base_url: `${other.url}/v1` }).annotate([diff], 64);
  const far = (diff[1].teacherLogprobs as number[]).map((t, i) => Math.abs(t - mu[i]));
  expect(Math.max(...far)).toBeGreaterThan(1e-2);
});

test("promptLogprobs over /v1/completions (echo) equals /v1/generate's prompt_logprobs", async () => {
  const s = await sampled();
  const ids = s.flatMap((seg) => Array.from(seg.tokens));
  const res = await fetch(`${student.url}/v1/generate`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt_token_ids: ids, max_tokens: 1, prompt_logprobs: true }),
  });
  const expected = ((await res.json()) as { prompt_logprobs: (number | null)[] }).prompt_logprobs;
  expect(expected).toHaveLength(ids.length);
  expect(await new TeacherClient({ base_url: `${student.url}/v1` }).promptLogprobs(ids)).toEqual(expected);
  // The served name, when configured, is what the requests carry; another name is refused.
  expect(
    await new TeacherClient({ base_url: `${student.url}/v1/`, served_model: studentDir }).promptLogprobs(ids),
  ).toEqual(expected);
  const named = await new TeacherClient({ base_url: `${student.url}/v1`, served_model: 'gpt-5' })
    .promptLogprobs(ids)
    .catch((e: unknown) => e);
  expect((named as InferenceError).kind).toBe('config');
  expect((named as Error).message).toMatch(
    /^distill\.teacher\.base_url: .*\/v1\/completions: HTTP 404: model 'gpt-5' does not exist/,
  );
});

/** A stand-in server: GET /models lists `models`; POST /completions answers `completion`. Records the bodies. */
async function standIn(
  models: string[],
  completion: unknown,
): Promise<{ url: string; seen: unknown[]; close(): void }> {
  const seen: unknown[] = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      seen.push(req.method === 'GET' ? req.url : JSON.parse(body));
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify(req.url === '/v1/models' ? { data: models.map((id) => ({ id })) } : completion));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return { url: `http://127.0.0.1:${port}/v1`, seen, close: () => server.close() };
}

test('the model named is the one the server lists; a server that lists several, or ignores echo, stops the run naming the key', async () => {
  // A server that ignores echo: only the generated token's logprob.
  const ignores = await standIn(['m'], {
    choices: [{ text: 'x', logprobs: { token_logprobs: [-0.5], tokens: ['x'] } }],
  });
  try {
    const client = new TeacherClient({ base_url: ignores.url });
    for (let i = 0; i < 2; i++) {
      const e = await client.promptLogprobs([5, 6, 7]).catch((err: unknown) => err);
      expect((e as InferenceError).kind).toBe('config');
      expect((e as Error).message).toMatch(
        /^distill\.teacher\.base_url: http:\/\/127\.0\.0\.1:\d+\/v1\/completions returned no logprobs of the prompt's tokens: .*must list the 3 prompt tokens' logprobs and then the generated token's \(got 1 entries\)/,
      );
    }
    // /models is read once; each request names its model.
    const ask = { model: 'm', prompt: [5, 6, 7], max_tokens: 1, echo: true, logprobs: 0, temperature: 1 };
    expect(ignores.seen).toEqual(['/v1/models', ask, ask]);
  } finally {
    ignores.close();
  }
  const several = await standIn(['a', 'b'], {});
  try {
    const e = await new TeacherClient({ base_url: several.url }).promptLogprobs([5, 6]).catch((err: unknown) => err);
    expect((e as InferenceError).kind).toBe('config');
    expect((e as Error).message).toBe(
      `distill.teacher.served_model: unset, and the teacher's server ${several.url} serves 2 models (a, b): set it to the teacher's`,
    );
    // Configured: /models is not read.
    const direct = await new TeacherClient({ base_url: several.url, served_model: 'b' })
      .promptLogprobs([5, 6])
      .catch((err: unknown) => err);
    expect((direct as Error).message).toMatch(/\(got none\)/);
    expect(several.seen.slice(1)).toEqual([expect.objectContaining({ model: 'b', prompt: [5, 6] })]);
  } finally {
    several.close();
  }
});

test('a sample of seq_len tokens: its last token gets no teacher logprob', async () => {
  const s = await sampled();
  const n = s[1].tokens.length;
  await new TeacherClient({ base_url: `${student.url}/v1` }).annotate([s], 3 + n);
  const t = Array.from(s[1].teacherLogprobs!);
  expect(t.slice(0, -1).every((x) => typeof x === 'number')).toBe(true);
  expect(t[n - 1]).toBeNull();
});

test('an unreachable teacher is an error Temporal retries; one that refuses the request stops the run', async () => {
  const s = await sampled();
  const down = await new TeacherClient({ base_url: 'http://127.0.0.1:1/v1' })
    .annotate([s], 64)
    .catch((e: unknown) => e);
  expect(down).toBeInstanceOf(InferenceError);
  expect((down as InferenceError).kind).toBe('unavailable');
  // Token ids outside the teacher's vocabulary: a 400, which no retry fixes.
  const bad: TokenSegment[] = [{ tokens: [1, 100000], generated: true, logprobs: [0, 0] }];
  const refused = await new TeacherClient({ base_url: `${student.url}/v1` })
    .annotate([bad], 64)
    .catch((e: unknown) => e);
  expect((refused as InferenceError).kind).toBe('config');
  expect((refused as Error).message).toMatch(
    /^distill\.teacher\.base_url: .*\/v1\/completions: HTTP 400: prompt: token id 100000/,
  );
});

test("a teacher whose tokenizer is not the student's is named by what differs", () => {
  const qwenDir = path.join(root, 'qwen');
  createModel({ arch: 'qwen3', preset: 'tiny', tokenizer: 'qwen3', seed: 0, out: qwenDir });
  const bytes = Tokenizer.fromDir(studentDir);
  expect(tokenizerMismatch(bytes, Tokenizer.fromDir(otherDir))).toBeUndefined();
  expect(tokenizerMismatch(bytes, Tokenizer.fromDir(qwenDir))).toMatch(
    /^its vocabulary has \d+ tokens, the student's \d+$/,
  );
});

test("a teacher server that wants an API key gets distill.teacher.api_key_var's; without it the run stops", async () => {
  process.env.TEST_PRIME_RL_TEACHER_KEY = 'sekrit';
  const keyed = await startServer(root, {
    modelDir: studentDir,
    seqLen: 64,
    settings: { server: { api_key_var: 'TEST_PRIME_RL_TEACHER_KEY' } },
  });
  try {
    const base_url = `${keyed.url}/v1`;
    const ids = [10, 20, 30, 40];
    const withKey = await new TeacherClient({ base_url, api_key_var: 'TEST_PRIME_RL_TEACHER_KEY' }).promptLogprobs(ids);
    expect(withKey).toHaveLength(ids.length);
    const without = await new TeacherClient({ base_url }).promptLogprobs(ids).catch((e: unknown) => e);
    expect((without as InferenceError).kind).toBe('config');
    expect((without as Error).message).toMatch(/^distill\.teacher\.base_url: .*\/v1\/models: HTTP 401/);
    expect(() => new TeacherClient({ base_url, api_key_var: 'TEST_PRIME_RL_TEACHER_UNSET' })).toThrow(
      "distill.teacher.api_key_var names environment variable TEST_PRIME_RL_TEACHER_UNSET, which is not set (or empty) in this worker's environment",
    );
  } finally {
    await keyed.close(1000);
    delete process.env.TEST_PRIME_RL_TEACHER_KEY;
  }
});

test('a teacher that stops answering (SIGSTOP: its connections still open) fails its requests once silent, for a retry', async () => {
  const s = await sampled();
  const procs = new CliProcesses(path.join(root, 'logs'));
  try {
    const { launch: teacher, url } = await inferenceProcess(procs, studentDir, 64);
    process.kill(teacher.child.pid!, 'SIGSTOP');
    // Each request's own deadline is 10 minutes; silent for 2 s (runs: temporal.heartbeat_timeout_s), it fails.
    const annotated = new TeacherClient({ base_url: `${url}/v1`, served_model: studentDir }, { livenessMs: 2_000 })
      .annotate([s], 64)
      .catch((e: unknown) => e);
    expect(await settlesWithin(annotated, 30_000)).toBe(true);
    const e = await annotated;
    expect(e).toBeInstanceOf(InferenceError);
    expect((e as InferenceError).kind).toBe('unavailable');
    expect((e as Error).message).toContain(`${url} answered nothing for`);
  } finally {
    procs.cleanup();
  }
});
