/** Rollouts against a real inference server, and the cpu activities of a step. */
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as os from 'node:os';
import * as path from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { MockActivityEnvironment } from '@temporalio/testing';
import { loadModel } from '../lib/model/engine';
import { createPackActivities, type PackSummary } from '../activities/pack';
import { createRolloutActivities } from '../activities/generate-rollouts';
import { readRollouts, type RolloutSummary } from '../lib/runfolder/rollouts';
import { createCpuActivities } from '../activities';
import { inferenceSchema, rlSchema } from '../lib/config/schemas';
import { EnvPool } from '../lib/envs/pool';
import { startInferenceServer, type InferenceServer } from '../lib/inference/server';
import { loadHfModel } from '../lib/model/hf';
import { Tokenizer } from '../lib/model/tokenizer';
import { readBatch } from '../lib/runfolder/batch';
import { InferenceClient, InferenceError } from '../lib/orchestrator/client';
import { RecordingClient } from './support/harness';
import { runChatRollout } from '../lib/orchestrator/chat-rollout';
import { isPromptTooLong, promptTooLong, runRollout } from '../lib/orchestrator/token-rollout';
import { RunLayout } from '../lib/runfolder/layout';
import { tinyModel, workflowRlConfig } from './support/setup';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-rollouts-'));
const modelDir = path.join(root, 'model');
let server: InferenceServer;
let pool: EnvPool;

/** An inference server on the test's model, on a free port, with `settings` (seq_len, threads, limits). */
const serverOn = (settings: object): Promise<InferenceServer> =>
  startInferenceServer(
    inferenceSchema.parse({ model: { name: modelDir }, output_dir: root, server: { port: 0 }, ...settings }),
  );

beforeAll(async () => {
  tinyModel(modelDir);
  server = await serverOn({ seq_len: 512, threads: 2 });
  pool = new EnvPool({ workers: 2, timeoutS: 30 });
});
afterAll(async () => {
  await pool?.close();
  await server?.close(1000);
  fs.rmSync(root, { recursive: true, force: true });
});

test('a multi-turn rollout extends the token ids of each turn exactly', async () => {
  const env = { id: 'guess-number', args: { max_turns: 3 } };
  const info = await pool.info(env);
  const example = await pool.example(env, 'train', 0, 0);
  if (!info.ok || !example.ok) throw new Error('env failed');
  const client = new RecordingClient([`${server.url}/v1`]);
  const tokenizer = Tokenizer.fromDir(modelDir);
  const sampling = { temperature: 1, top_p: 1, top_k: -1, min_p: 0, max_tokens: 12 };
  const rollout = await runRollout(
    { env, info: info.value, example: example.value, seed: 5, seqLen: 512, sampling },
    pool,
    client,
    tokenizer,
  );

  expect(rollout.error).toBeUndefined();
  expect(rollout.turns).toBe(3);
  // Our ChatML template has the prefix property: one sample.
  expect(rollout.samples).toHaveLength(1);
  const [segments] = rollout.samples;
  const kinds = segments.map((s) => (s.generated ? 'model' : 'env'));
  expect(kinds).toEqual(['env', 'model', 'env', 'model', 'env', 'model']);
  // The prompt of turn t is every token before it: earlier turns were never re-tokenised.
  const flat = (k: number) => segments.slice(0, k).flatMap((s) => Array.from(s.tokens));
  expect(client.prompts).toHaveLength(3);
  expect(client.prompts[0]).toEqual(flat(1));
  expect(client.prompts[1]).toEqual(flat(3));
  expect(client.prompts[2]).toEqual(flat(5));
  // The environment's turn is the template's text between the model's turns.
  const envText = tokenizer.decode(Array.from(segments[2].tokens));
  expect(envText).toMatch(
    /<\|im_start\|>user\n(Higher\.|Lower\.|Write one integer guess in <guess> tags\.)<\|im_end\|>\n<\|im_start\|>assistant\n$/,
  );
  expect(rollout.completion.map((m) => m.role)).toEqual(['assistant', 'user', 'assistant', 'user', 'assistant']);

  // Every sampled token's inference logprob equals the engine scoring the whole rollout.
  const ids = flat(segments.length);
  const hf = loadHfModel(modelDir);
  const model = await loadModel(hf.config, hf.tensors);
  const [scores] = await model.score([{ inputIds: ids, positionIds: ids.map((_, i) => i) }]);
  let at = 0;
  for (const s of segments) {
    if (s.generated) Array.from(s.logprobs!).forEach((lp, i) => expect(lp).toBeCloseTo(scores.logprobs[at + i], 4));
    at += s.tokens.length;
  }
});

test("a chat rollout (the eval path of an external API) is played by the same driver; a 4xx errors it with the body's message", async () => {
  const env = { id: 'guess-number', args: { max_turns: 2 } };
  const info = await pool.info(env);
  const example = await pool.example(env, 'train', 0, 0);
  if (!info.ok || !example.ok) throw new Error('env failed');
  const task = {
    env,
    info: info.value,
    example: example.value,
    seed: 1,
    sampling: { temperature: 1, top_p: 1, top_k: -1, min_p: 0, max_tokens: 8 },
  };
  const api = { baseUrl: `${server.url}/v1`, model: modelDir };
  const ok = await runChatRollout(task, pool, api);
  expect(ok.error).toBeUndefined();
  expect(ok.completion.map((m) => m.role)).toEqual(['assistant', 'user', 'assistant']);
  expect(ok.turns).toBe(2);
  expect(ok.completionTokens).toBeGreaterThan(0);
  // A request the API refuses: the message of its OpenAI-style error body, not the raw JSON.
  const refused = await runChatRollout(task, pool, { ...api, model: 'no-such-model' });
  expect(refused.error).toBe(
    `${server.url}/v1/chat/completions: HTTP 404: model 'no-such-model' does not exist; this server serves '${modelDir}'`,
  );
  expect(refused.turns).toBe(0);
});

test("what our server's answers mean: a bad request errors one rollout, a wrong address the run, a full queue waits", async () => {
  const params = { temperature: 1, top_p: 1, top_k: -1, min_p: 0, max_tokens: 4, seed: 1 };
  const client = new InferenceClient([`${server.url}/v1`]);
  // 400 for this one request (a token outside the vocabulary): that rollout's error only.
  const bad = await client.generate([1_000_000], params).catch((e: unknown) => e);
  expect(bad).toBeInstanceOf(InferenceError);
  expect([
    (bad as InferenceError).status,
    (bad as InferenceError).kind,
    (bad as InferenceError).rejectsRequest,
  ]).toEqual([400, 'request', true]);
  // 404: not a prime-rl server's route (a wrong base URL): no retry can fix it.
  const lost = await new InferenceClient([`${server.url}/nowhere/v1`])
    .generate([1, 2], params)
    .catch((e: unknown) => e);
  expect([
    (lost as InferenceError).status,
    (lost as InferenceError).kind,
    (lost as InferenceError).rejectsRequest,
  ]).toEqual([404, 'config', false]);

  // A server that queues 1 request and runs 1: 12 requests at once through an unbounded client
  // meet 429s, which the client retries until every one is served.
  const small = await serverOn({ seq_len: 128, threads: 1, max_running: 1, max_queued: 1 });
  try {
    const unbounded = new InferenceClient([`${small.url}/v1`]);
    const results = await Promise.all(
      Array.from({ length: 12 }, (_, i) => unbounded.generate([1, 2, 3], { ...params, seed: i })),
    );
    expect(results.map((r) => r.finishReason).filter((f) => f === 'stop' || f === 'length')).toHaveLength(12);
    // ... after the server did answer 429 (its request counter says so).
    const metrics = await (await fetch(`${small.url}/metrics`)).text();
    expect(metrics).toMatch(/prime_inference_requests_total\{route="\/v1\/generate",status="429"\} [1-9]/);
  } finally {
    await small.close(1000);
  }
});

test("ensurePolicy moves a server that serves the wanted version number from another folder (another run's weights)", async () => {
  const [mine, theirs] = [path.join(root, 'policy', 'mine'), path.join(root, 'policy', 'theirs')];
  tinyModel(theirs, { seed: 1 });
  tinyModel(mine, { seed: 2 });
  const client = new InferenceClient([`${server.url}/v1`]);
  const health = async () =>
    (await (await fetch(`${server.url}/health`)).json()) as { policy_version: number; weight_dir: string };
  await client.ensurePolicy({ version: 1, weightDir: theirs });
  expect(await health()).toMatchObject({ policy_version: 1, weight_dir: fs.realpathSync(theirs) });
  await client.ensurePolicy({ version: 1, weightDir: mine });
  expect(await health()).toMatchObject({ policy_version: 1, weight_dir: fs.realpathSync(mine) });
  await client.ensurePolicy({ version: 0, weightDir: '' });
  expect((await health()).policy_version).toBe(0);
});

test("load() sums the fleet's running and queued sequences from /metrics; a server without the gauges gives no reading", async () => {
  const small = await serverOn({ seq_len: 1024, threads: 1, max_running: 2 });
  // A server with no /metrics page (an OpenAI-compatible proxy, say).
  const bare = http.createServer((_req, res) => {
    res.statusCode = 404;
    res.end();
  });
  await new Promise<void>((resolve) => bare.listen(0, '127.0.0.1', resolve));
  try {
    const fleet = new InferenceClient([`${small.url}/v1`, `${server.url}/v1`]);
    expect(await fleet.load()).toEqual({ running: 0, waiting: 0 });
    // Six long sequences on a server that decodes two at once: two run, the others queue. (A
    // sequence that arrives joins the batch at the next decode step: until then it counts as queued.)
    let done = 0;
    const requests = Array.from({ length: 6 }, (_, seed) =>
      fetch(`${small.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 400, ignore_eos: true, seed }),
      }).then((r) => {
        done++;
        return r.status;
      }),
    );
    const readings = [];
    while (done < requests.length) {
      readings.push(await fleet.load());
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect(await Promise.all(requests)).toEqual([200, 200, 200, 200, 200, 200]);
    // Never more than max_running in the batch, nor more sequences than were sent; the second
    // server, idle, adds nothing.
    for (const r of readings) {
      expect(r!.running).toBeLessThanOrEqual(2);
      expect(r!.running + r!.waiting).toBeLessThanOrEqual(6);
    }
    // A full batch with three or more behind it (four queue until the first two finish).
    expect(readings.some((r) => r!.running === 2 && r!.waiting >= 3)).toBe(true);
    expect(await fleet.load()).toEqual({ running: 0, waiting: 0 });
    const port = (bare.address() as { port: number }).port;
    expect(await new InferenceClient([`${small.url}/v1`, `http://127.0.0.1:${port}/v1`]).load()).toBeUndefined();
  } finally {
    bare.close();
    await small.close(1000);
  }
});

describe('step activities', () => {
  const layout = new RunLayout(path.join(root, 'runs', 'r1'));
  const mock = new MockActivityEnvironment();

  beforeAll(() => {
    const config = rlSchema.parse({
      run_name: 'r1',
      model: { name: modelDir },
      env: [{ id: 'reverse-text' }, { id: 'arithmetic', weight: 1 }],
      seq_len: 512,
      trainer: { model: { name: modelDir } },
      inference: { model: { name: modelDir } },
      orchestrator: {
        model: { name: modelDir },
        seq_len: 512,
        batch_size: 8,
        rollouts_per_example: 4,
        base_urls: [`${server.url}/v1`],
        sampling: { max_tokens: 16 },
      },
    });
    fs.mkdirSync(path.dirname(layout.configFile), { recursive: true });
    fs.writeFileSync(layout.configFile, JSON.stringify(config));
  });

  test('an in-flight claim whose left-over group is gone from the run folder fails, non-retryable, naming it', async () => {
    const run = new RunLayout(path.join(root, 'runs', 'r-inflight'));
    const stored = JSON.parse(fs.readFileSync(layout.configFile, 'utf8')) as { orchestrator: object; run_name: string };
    const config = {
      ...stored,
      run_name: 'r-inflight',
      orchestrator: { ...stored.orchestrator, in_flight: { enabled: true, keep_mix: true } },
    };
    fs.mkdirSync(path.dirname(run.configFile), { recursive: true });
    fs.writeFileSync(run.configFile, JSON.stringify(config));
    // Step 0's claim left group 1 over for step 1; then the group's file went (removed by hand).
    fs.mkdirSync(run.inflightGroupsDir, { recursive: true });
    fs.mkdirSync(path.dirname(run.rolloutsSummaryFile(0)), { recursive: true });
    fs.writeFileSync(run.rolloutsSummaryFile(0), JSON.stringify({ step: 0, inFlight: { next: 3, deferred: [1] } }));
    const { claimRollouts } = createCpuActivities({ pool });
    const err = await mock.run(claimRollouts, { runDir: run.dir, step: 1 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ApplicationFailure);
    expect([(err as ApplicationFailure).type, (err as ApplicationFailure).nonRetryable]).toEqual([
      'RunFolderDamaged',
      true,
    ]);
    expect((err as Error).message).toContain(
      `in-flight group 1, left by step 0 for step 1, is missing from ${run.inflightGroupsDir}`,
    );
  });

  test('generateRollouts writes the step and returns a summary; a second call returns the stored one', async () => {
    const { generateRollouts } = createRolloutActivities({ pool });
    const summary: RolloutSummary = await mock.run(generateRollouts, { runDir: layout.dir, step: 0, policyVersion: 0 });
    expect(summary.rollouts).toBe(8);
    expect(summary.errored).toBe(0);
    const stored = readRollouts(layout.rolloutsDir(0));
    expect(stored).toHaveLength(8);
    expect(new Set(stored.map((r) => r.group))).toEqual(new Set([0, 1]));
    expect(new Set(stored.map((r) => r.env))).toEqual(new Set(['reverse-text', 'arithmetic']));

    // With no inference server reachable, only a stored result can answer.
    const offline = createRolloutActivities({ pool });
    const generatedBefore = server.scheduler.generatedTokens;
    expect(await mock.run(offline.generateRollouts, { runDir: layout.dir, step: 0, policyVersion: 0 })).toEqual(
      summary,
    );
    expect(server.scheduler.generatedTokens).toBe(generatedBefore);
  });

  test('packBatch packs the rollouts into a batch file; a retry returns the same batch', async () => {
    const { packBatch } = createPackActivities();
    const summary: PackSummary = await mock.run(packBatch, { runDir: layout.dir, step: 0 });
    const batch = readBatch(summary.path);
    expect(batch.step).toBe(0);
    expect(batch.rows.length).toBe(summary.counts.rows);
    const kept = summary.advantages.rollouts_kept;
    expect(summary.counts.samples).toBe(kept);
    const loss = batch.rows.reduce((a, r) => a + r.lossMask.reduce((x, y) => x + y, 0), 0);
    expect(loss).toBe(summary.counts.lossTokens);
    const mtime = fs.statSync(summary.path).mtimeMs;
    expect(await mock.run(packBatch, { runDir: layout.dir, step: 0 })).toEqual(summary);
    expect(fs.statSync(summary.path).mtimeMs).toBe(mtime);
  });
});

/** A run folder whose config is `orchestrator` over the defaults (no inference needed). */
function runFolder(name: string, orchestrator: Record<string, unknown>, seqLen = 512): RunLayout {
  const layout = new RunLayout(path.join(root, 'runs', name));
  const config = rlSchema.parse({
    run_name: name,
    model: { name: modelDir },
    env: [{ id: 'reverse-text' }],
    seq_len: seqLen,
    trainer: { model: { name: modelDir }, seq_len: seqLen },
    inference: { model: { name: modelDir }, seq_len: seqLen },
    orchestrator: {
      model: { name: modelDir },
      seq_len: seqLen,
      batch_size: 8,
      rollouts_per_example: 4,
      base_urls: [`${server.url}/v1`],
      ...orchestrator,
    },
  });
  fs.mkdirSync(path.dirname(layout.configFile), { recursive: true });
  fs.writeFileSync(layout.configFile, JSON.stringify(config));
  return layout;
}

/** Stored rollouts of step 0: `groups` x `perGroup`, each a prompt of `prompt` tokens and a completion of `completion`. */
function writeRollouts(
  layout: RunLayout,
  o: {
    groups: number;
    perGroup: number;
    prompt: number;
    completion: number;
    error?: string;
    reward?: (g: number, s: number) => number;
  },
) {
  const lines: string[] = [];
  for (let g = 0; g < o.groups; g++) {
    for (let s = 0; s < o.perGroup; s++) {
      const tokens = (n: number) => Array.from({ length: n }, (_, i) => 3 + ((g * 7 + s * 3 + i) % 250));
      lines.push(
        JSON.stringify({
          env: 'reverse-text',
          group: g,
          exampleIndex: g,
          sample: s,
          seed: s,
          completion: [],
          reward: o.reward ? o.reward(g, s) : s,
          metrics: {},
          turns: 1,
          completionTokens: o.completion,
          truncated: false,
          policyVersion: 0,
          segments: [
            { tokens: tokens(o.prompt), generated: false },
            { tokens: tokens(o.completion), generated: true, logprobs: Array(o.completion).fill(-1) },
          ],
          ...(o.error ? { error: o.error } : {}),
        }),
      );
    }
  }
  fs.mkdirSync(layout.rolloutsDir(0), { recursive: true });
  fs.writeFileSync(path.join(layout.rolloutsDir(0), 'rollouts.jsonl'), lines.join('\n') + '\n');
}

/** The non-retryable failure `p` rejects with. */
async function failure(p: Promise<unknown>): Promise<ApplicationFailure> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(ApplicationFailure);
  expect((e as ApplicationFailure).nonRetryable).toBe(true);
  return e as ApplicationFailure;
}

describe('runs that cannot train fail, naming why', () => {
  const mock = new MockActivityEnvironment();

  test('a seq_len shorter than every prompt fails generateRollouts before any token is generated, naming orchestrator.seq_len', async () => {
    const layout = runFolder('short-seq', {}, 8);
    const generatedBefore = server.scheduler.generatedTokens;
    const { generateRollouts } = createRolloutActivities({ pool });
    const f = await failure(mock.run(generateRollouts, { runDir: layout.dir, step: 0, policyVersion: 0 }));
    expect(f.type).toBe('InvalidConfig');
    expect(f.message).toMatch(
      /^orchestrator\.seq_len \(8\) is too short for the environments' prompts: the 2 prompts of step 0 and the first 32 of each environment are \d+ tokens or longer/,
    );
    expect(f.message).toContain('raise seq_len');
    expect(server.scheduler.generatedTokens).toBe(generatedBefore);
    expect(fs.existsSync(layout.rolloutsDir(0))).toBe(false);
  });

  test('a run started without the CLI (temporal workflow start) is checked as the CLI checks it', async () => {
    const config = workflowRlConfig('no-cli', modelDir, path.join(root, 'runs'));
    const bad = { ...config, orchestrator: { ...config.orchestrator, batch_size: 10, rollouts_per_example: 4 } };
    // As a worker registers it: lib's config check fails it non-retryably (activities/failures.ts).
    const { prepareRun } = createCpuActivities({ pool });
    const f = await failure(mock.run(prepareRun, bad));
    expect(f.type).toBe('InvalidConfig');
    expect(f.message).toMatch(
      /^invalid configuration: orchestrator\.batch_size: 10 is not a multiple of orchestrator\.rollouts_per_example \(4\)/,
    );
    expect(fs.existsSync(RunLayout.of(config.output_dir, 'no-cli').dir)).toBe(false);
  });

  test('a prompt too long for seq_len errors its rollout instead of a silent empty one', async () => {
    const env = { id: 'reverse-text' };
    const info = await pool.info(env);
    const example = await pool.example(env, 'train', 0, 0);
    if (!info.ok || !example.ok) throw new Error('env failed');
    const client = new InferenceClient([`${server.url}/v1`]);
    const sampling = { temperature: 1, top_p: 1, top_k: -1, min_p: 0 };
    const rollout = await runRollout(
      { env, info: info.value, example: example.value, seed: 1, seqLen: 8, sampling },
      pool,
      client,
      Tokenizer.fromDir(modelDir),
    );
    expect(isPromptTooLong(rollout.error)).toBe(true);
    expect(rollout.error).toMatch(
      /^prompt too long: the prompt is \d+ tokens, which leaves no room to generate within seq_len 8/,
    );
    expect(rollout.completionTokens).toBe(0);
  });

  test('packBatch fails a step whose rollouts all errored, with their errors', async () => {
    const layout = runFolder('all-errored', {});
    writeRollouts(layout, {
      groups: 2,
      perGroup: 4,
      prompt: 10,
      completion: 5,
      error: 'environment score failed: boom',
    });
    const { packBatch } = createPackActivities();
    const f = await failure(mock.run(packBatch, { runDir: layout.dir, step: 0 }));
    expect(f.type).toBe('NothingToTrain');
    expect(f.message).toBe(
      'step 0 has nothing to train: all 8 rollouts errored (first errors: environment score failed: boom | environment score failed: boom | environment score failed: boom)',
    );
  });

  test('a step whose prompts were all too long by chance (the check found prompts that fit) trains nothing and is recorded', async () => {
    const layout = runFolder('all-long', {});
    writeRollouts(layout, { groups: 2, perGroup: 4, prompt: 10, completion: 5, error: promptTooLong(300, 256) });
    const { packBatch } = createPackActivities();
    const summary: PackSummary = await mock.run(packBatch, { runDir: layout.dir, step: 0 });
    expect(summary.advantages.rollouts_errored).toBe(8);
    expect(summary.counts.samples).toBe(0);
  });

  test('packBatch fails a step whose samples keep no generated token within seq_len, naming orchestrator.seq_len', async () => {
    // Rollouts longer than seq_len (the env's reply pushed them past it): packing cuts their completions.
    const layout = runFolder('cut', {}, 16);
    writeRollouts(layout, { groups: 2, perGroup: 4, prompt: 20, completion: 5 });
    const { packBatch } = createPackActivities();
    const f = await failure(mock.run(packBatch, { runDir: layout.dir, step: 0 }));
    expect(f.type).toBe('InvalidConfig');
    expect(f.message).toBe(
      'step 0 has nothing to train: its 8 samples carry no generated token within orchestrator.seq_len (16) (72 tokens cut off); raise seq_len (the shared key)',
    );
  });

  test('a step whose groups all carry no signal (equal rewards) is a normal step that trains nothing', async () => {
    const layout = runFolder('no-signal', {});
    writeRollouts(layout, { groups: 2, perGroup: 4, prompt: 10, completion: 5, reward: () => 1 });
    const { packBatch } = createPackActivities();
    const summary: PackSummary = await mock.run(packBatch, { runDir: layout.dir, step: 0 });
    expect(summary.counts.samples).toBe(0);
    expect(summary.advantages.zero_advantage_rollouts).toBe(8);
    expect(summary.advantages.zero_advantage_tokens).toBe(8 * 5);
  });
});

test('packBatch heartbeats while it packs a big batch', async () => {
  const layout = runFolder('big', { batch_size: 512, rollouts_per_example: 8 }, 2048);
  writeRollouts(layout, { groups: 64, perGroup: 8, prompt: 512, completion: 1024 });
  const mock = new MockActivityEnvironment();
  const beats: unknown[] = [];
  mock.on('heartbeat', (d: unknown) => beats.push(d));
  const { packBatch } = createPackActivities();
  const summary: PackSummary = await mock.run(packBatch, { runDir: layout.dir, step: 0 });
  expect(summary.counts.samples).toBe(512);
  // Each phase of the work reported while it ran, not only its end.
  const phases = beats.map((b) => (b as { phase?: string }).phase);
  for (const p of ['reading', 'advantages', 'packing', 'writing']) expect(phases).toContain(p);
});

describe('filtered steps (rollout filters, refill)', () => {
  const mock = new MockActivityEnvironment();
  /** A module under the temp folder, named relative to the working directory as a user writes it. */
  const plugin = (name: string, source: string) => {
    fs.writeFileSync(path.join(root, name), source);
    return './' + path.relative(process.cwd(), path.join(root, name));
  };
  // Drops the step's own first `below` groups; keeps every refill.
  const FILTER = plugin(
    'early_filter.ts',
    "export const filter = (g: { group: number; round: number }, kw: { below: number }) => (g.round === 0 && g.group < kw.below ? 'early' : true);\n",
  );
  const ADV = plugin('plus_one.ts', 'export default (g: { rewards: number[] }) => g.rewards.map((r) => r + 1);\n');
  const orchestrator = (extra: Record<string, unknown>) => ({
    sampling: { max_tokens: 16 },
    filter_zero_advantages: false,
    ...extra,
  });

  test('dropped groups are refilled with fresh examples: the step still trains on batch_size rollouts, and a rerun writes the same step', async () => {
    const settings = orchestrator({
      rollout_filters: [{ import_path: FILTER, kwargs: { below: 2 } }],
      advantage: { import_path: ADV },
    });
    const layout = runFolder('refill', settings);
    const { generateRollouts } = createRolloutActivities({ pool });
    const summary: RolloutSummary = await mock.run(generateRollouts, { runDir: layout.dir, step: 3, policyVersion: 0 });
    expect(summary.filter).toEqual({
      groups_generated: 4,
      groups_dropped: 2,
      dropped_by: { [`${FILTER}/early`]: 2 },
      refill_rounds: 1,
      groups_missing: 0,
    });
    expect(summary.rollouts).toBe(16);
    const stored = readRollouts(layout.rolloutsDir(3));
    expect(stored).toHaveLength(8);
    expect(stored.map((r) => [r.group, r.round])).toEqual([2, 2, 2, 2, 3, 3, 3, 3].map((g) => [g, 1]));
    const dropped = fs
      .readFileSync(path.join(layout.rolloutsDir(3), 'dropped.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(dropped.map((r) => [r.group, r.round, r.dropped])).toEqual(
      [0, 0, 0, 0, 1, 1, 1, 1].map((g) => [g, 0, `${FILTER}/early`]),
    );
    // A retry returns the stored step.
    expect(await mock.run(generateRollouts, { runDir: layout.dir, step: 3, policyVersion: 0 })).toEqual(summary);

    // The step packs batch_size samples, with the plugin estimator (loaded in packBatch's thread).
    const packed: PackSummary = await mock.run(createPackActivities().packBatch, { runDir: layout.dir, step: 3 });
    expect(packed.counts.samples).toBe(8);
    const batch = readBatch(packed.path);
    const advantages = new Set(
      batch.rows.flatMap((r) => Array.from(r.advantages).filter((_, i) => r.lossMask[i] === 1)),
    );
    expect([...advantages].every((a) => a >= 1)).toBe(true);

    // The same step from scratch (as after a crash) draws the same refill examples and plays the same requests.
    const again = runFolder('refill-again', settings);
    await mock.run(generateRollouts, { runDir: again.dir, step: 3, policyVersion: 0 });
    const key = (r: (typeof stored)[number]) => [
      r.env,
      r.exampleIndex,
      r.group,
      r.round,
      r.seed,
      r.samples.flat().map((s) => Array.from(s.tokens)),
    ];
    expect(readRollouts(again.rolloutsDir(3)).map(key)).toEqual(stored.map(key));
  });

  test('refills are bounded by max_refill_rounds; what the step is short of is counted', async () => {
    const layout = runFolder(
      'exhausted',
      orchestrator({ difficulty_filter: { enabled: true, min_reward_variance: 1e9 }, max_refill_rounds: 1 }),
    );
    const summary: RolloutSummary = await mock.run(createRolloutActivities({ pool }).generateRollouts, {
      runDir: layout.dir,
      step: 0,
      policyVersion: 0,
    });
    expect(summary.filter).toEqual({
      groups_generated: 4,
      groups_dropped: 4,
      dropped_by: { 'difficulty/reward_variance': 4 },
      refill_rounds: 1,
      groups_missing: 2,
    });
    expect(readRollouts(layout.rolloutsDir(0))).toHaveLength(0);
    const packed: PackSummary = await mock.run(createPackActivities().packBatch, { runDir: layout.dir, step: 0 });
    expect(packed.counts.samples).toBe(0);
  });
});
