/**
 * An unmodified verifiers (0.4.0) env server on our own taskset (test/fixtures/verifiers/
 * reverse_words), against our inference server with a tiny model and our own tokenizer folder,
 * offline: RL steps through the real rl workflow (and its evals), samples checked token by token
 * against what the server generates; crashes and hangs of the env server error only their rollout.
 * Needs the venv scripts/setup.sh builds (.venv-verifiers) or PRIME_RL_VERIFIERS_PYTHON.
 */
/* eslint-disable @typescript-eslint/no-explicit-any -- JSON bodies of raw HTTP responses */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { readRollouts } from '../lib/runfolder/rollouts';
import { readEvalResults } from '../lib/eval';
import { EnvPool } from '../lib/envs/pool';
import { VERIFIERS_VENV } from '../lib/envs/verifiers/environment';
import type { InferenceServer } from '../lib/inference/server';
import { Tokenizer } from '../lib/model/tokenizer';
import { renderPrompt } from '../lib/orchestrator/token-rollout';
import { runVerifiersRollout } from '../lib/orchestrator/verifiers-rollout';
import { RunLayout } from '../lib/runfolder/layout';
import { readStepMetrics } from '../lib/runfolder/metrics';
import { closeStack, executeRl, type Stack, startStack } from './support/harness';
import { rlConfig, tinyModel, verifiersSuite } from './support/setup';

const python = process.env.PRIME_RL_VERIFIERS_PYTHON ?? path.join(VERIFIERS_VENV, 'bin', 'python');
const suite = verifiersSuite('verifiers.env.test.ts', python);

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-verifiers-'));
const modelDir = path.join(root, 'model');
const fixtures = path.join(__dirname, 'fixtures', 'verifiers');
const SEQ_LEN = 256;
const envArgs = (extra: object = {}) => ({
  python,
  paths: [fixtures],
  taskset: { size: 12 },
  eval_size: 4,
  ...extra,
});
let stack: Stack & { inference: InferenceServer };

const post = async (route: string, body: unknown): Promise<any> => {
  const res = await fetch(`${stack.inference.url}${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  expect(res.status).toBe(200);
  return res.json();
};

suite('verifiers env servers', () => {
  beforeAll(async () => {
    tinyModel(modelDir);
    stack = await startStack(root, { modelDir, seqLen: SEQ_LEN });
    // Listing the taskset starts Python (imports verifiers): slower than the stack's default 30 s on a busy machine.
    await stack.pool.close();
    stack.pool = new EnvPool({ workers: 1, timeoutS: 120 });
  }, 120_000);
  afterAll(() => closeStack(stack, root));

  test('rl trains on a verifiers env: samples are the exact tokens, masks and logprobs the server sampled', async () => {
    const cfg = rlConfig([
      ...['--model.name', modelDir, '--output-dir', path.join(root, 'outputs'), '--seq-len', String(SEQ_LEN)],
      ...['--orchestrator.base-urls', `${stack.inference.url}/v1`, '--trainer.threads', '1'],
      ...['--run-name', 'vf', '--max-steps', '2', '--async-level', '0'],
      ...['--env', JSON.stringify([{ id: 'verifiers:reverse_words', args: envArgs() }])],
      ...['--orchestrator.batch-size', '4', '--orchestrator.rollouts-per-example', '2'],
      ...['--orchestrator.sampling.max-tokens', '10', '--trainer.optim.lr', '1e-3'],
      ...['--eval.interval', '2', '--eval.num-examples', '2', '--eval.sampling.max-tokens', '10'],
    ]);
    const result = await executeRl(stack, cfg);
    expect(result.steps).toBe(2);
    const layout = RunLayout.of(cfg.output_dir, cfg.run_name);
    const lines = readStepMetrics(layout.metricsFile);
    expect(lines.map((l) => l.step)).toEqual([0, 1]);
    for (const l of lines) expect(Number.isFinite(l.loss as number)).toBe(true);
    expect(readEvalResults(layout.dir).map((r) => r.model)).toEqual(['base', 'step_2']);

    // Step 0 sampled from the base model: replay each sample's prompt with its seed at version 0.
    await post('/reload_weights', {});
    const tokenizer = Tokenizer.fromDir(modelDir);
    const rollouts = readRollouts(layout.rolloutsDir(0));
    expect(rollouts).toHaveLength(4);
    for (const r of rollouts) {
      expect(r.error).toBeUndefined();
      expect(r.env).toBe('verifiers:reverse_words');
      expect(r.metrics).toHaveProperty('lcs');
      expect(r.metrics).toHaveProperty('reply_chars');
      expect(r.reward).toBeCloseTo(r.metrics.lcs, 10);
      expect(r.samples).toHaveLength(1);
      const [prompt, completion, ...rest] = r.samples[0];
      // One prompt span (template and messages, not sampled), then the sampled completion.
      expect(rest).toEqual([]);
      expect(prompt.generated).toBe(false);
      expect(completion.generated).toBe(true);
      const promptIds = Array.from(prompt.tokens);
      const task = r.completion;
      expect(task.length).toBe(1);
      // The renderer's tokens are the chat template our own tokenizer renders for the same messages.
      const system = 'Reverse the text character-by-character. Put your answer in <reversed_text> tags.';
      const word = tokenizer.decode(promptIds).match(/<\|im_start\|>user\n(.*?)<\|im_end\|>/s)?.[1] ?? '';
      expect(word).toMatch(/^[a-j]{3,6}$/);
      expect(promptIds).toEqual(
        renderPrompt(
          tokenizer,
          [
            { role: 'system', content: system },
            { role: 'user', content: word },
          ],
          [],
        ).ids,
      );
      // The mask covers exactly the sampled tokens, with one finite logprob each.
      const sampled = Array.from(completion.tokens);
      expect(r.completionTokens).toBe(sampled.length);
      expect(Array.from(completion.logprobs!)).toHaveLength(sampled.length);
      // What the server generates for this prompt with this rollout's seed and sampling.
      const again = await post('/inference/v1/generate', {
        model: modelDir,
        token_ids: promptIds,
        sampling_params: { temperature: 1, top_p: 1, top_k: -1, min_p: 0, seed: r.seed, max_tokens: 10 },
      });
      expect(again.policy_version).toBe(0);
      expect(sampled).toEqual(again.choices[0].token_ids);
      const logprobs = Array.from(completion.logprobs!);
      again.choices[0].logprobs.content.forEach((e: any, k: number) => expect(logprobs[k]).toBeCloseTo(e.logprob, 3));
      expect(task[0].role).toBe('assistant');
    }
  }, 600_000);

  test('a rollout that crashes or hangs its env server errors alone; the next one gets a fresh server', async () => {
    const tasks = (behaviour: string) => ({
      prompt: 'abc',
      system_prompt: 'Reverse the text.',
      answer: 'cba',
      behaviour,
    });
    const rollout = (behaviour: string) =>
      runVerifiersRollout(
        {
          env: { id: 'verifiers:reverse_words', args: envArgs({ timeout_s: 20 }) },
          info: { name: 'vf', maxTurns: 1, tools: [], size: { train: 1, eval: 0 } },
          example: { prompt: [], answer: 'cba', info: { task_data: tasks(behaviour) } },
          seed: 1,
          seqLen: SEQ_LEN,
          sampling: { temperature: 1, top_p: 1, top_k: -1, min_p: 0, max_tokens: 6 },
        },
        stack.pool.verifiers,
        { baseUrl: `${stack.inference.url}/v1`, model: modelDir, policyVersion: 0 },
      );
    const ok = await rollout('ok');
    expect(ok.error).toBeUndefined();
    expect(ok.samples).toHaveLength(1);
    const hung = await rollout('hang');
    expect(hung.error).toMatch(/timed out after 20s/);
    expect(hung.samples).toEqual([]);
    // The hang was one cancelled rollout: the server still answers.
    expect((await rollout('ok')).error).toBeUndefined();
    const restarts = stack.pool.verifiers.stats.restarts;
    const crashed = await rollout('crash');
    expect(crashed.error).toMatch(/crashed: env server exited/);
    const after = await rollout('ok');
    expect(after.error).toBeUndefined();
    expect(after.samples[0].some((s) => s.generated)).toBe(true);
    expect(stack.pool.verifiers.stats.restarts).toBe(restarts + 1);
  }, 300_000);
});
