/**
 * Online distillation's teacher (lib/orchestrator/teacher.ts) against real inference servers: the
 * teacher's logprobs of sampled tokens (one prompt-logprobs request per sample), and the start-up
 * check that its tokenizer is the student's.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { InferenceServer } from '../lib/inference/server';
import { createModel } from '../lib/model/create';
import { Tokenizer } from '../lib/model/tokenizer';
import { InferenceError } from '../lib/orchestrator/client';
import type { TokenSegment } from '../lib/orchestrator/packing';
import { TeacherClient, tokenizerMismatch } from '../lib/orchestrator/teacher';
import { startServer } from './harness';

jest.setTimeout(120_000);

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-teacher-'));
const studentDir = path.join(root, 'student');
const otherDir = path.join(root, 'other');
let student: InferenceServer;
let other: InferenceServer;

beforeAll(async () => {
  createModel({ arch: 'qwen3', preset: 'tiny', tokenizer: 'bytes', seed: 0, out: studentDir });
  createModel({ arch: 'qwen3', preset: 'tiny', tokenizer: 'bytes', seed: 1, out: otherDir });
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
  await new TeacherClient(`${student.url}/v1`).annotate([same], 64);
  const [mu, teacher] = [Array.from(same[1].logprobs!), Array.from(same[1].teacherLogprobs!) as number[]];
  expect(teacher).toHaveLength(same[1].tokens.length);
  teacher.forEach((t, i) => expect(Math.abs(t - mu[i])).toBeLessThan(1e-3));
  expect(same[0].teacherLogprobs).toBeUndefined();

  const diff = await sampled();
  await new TeacherClient(`${other.url}/v1`).annotate([diff], 64);
  const far = (diff[1].teacherLogprobs as number[]).map((t, i) => Math.abs(t - mu[i]));
  expect(Math.max(...far)).toBeGreaterThan(1e-2);
});

test('a sample of seq_len tokens: its last token gets no teacher logprob', async () => {
  const s = await sampled();
  const n = s[1].tokens.length;
  await new TeacherClient(`${student.url}/v1`).annotate([s], 3 + n);
  const t = Array.from(s[1].teacherLogprobs!);
  expect(t.slice(0, -1).every((x) => typeof x === 'number')).toBe(true);
  expect(t[n - 1]).toBeNull();
});

test('an unreachable teacher is an error Temporal retries; one that refuses the request stops the run', async () => {
  const s = await sampled();
  const down = await new TeacherClient('http://127.0.0.1:1/v1').annotate([s], 64).catch((e: unknown) => e);
  expect(down).toBeInstanceOf(InferenceError);
  expect((down as InferenceError).kind).toBe('unavailable');
  // Token ids outside the teacher's vocabulary: a 400, which no retry fixes.
  const bad: TokenSegment[] = [{ tokens: [1, 100000], generated: true, logprobs: [0, 0] }];
  const refused = await new TeacherClient(`${student.url}/v1`).annotate([bad], 64).catch((e: unknown) => e);
  expect((refused as InferenceError).kind).toBe('config');
  expect((refused as Error).message).toMatch(
    /^distill\.teacher\.base_url: .*HTTP 400: prompt_token_ids: token id 100000/,
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
