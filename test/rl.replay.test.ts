/**
 * MoE router replay end to end (`trainer.moe.router_replay`): a tiny qwen3_moe model through a
 * real Temporal workflow, inference server and trainer. The rollouts keep the experts the server
 * routed each token to, the batches carry them, the trainer replays them; dense models refuse it.
 */
import * as path from 'node:path';
import type { RLConfig } from '../lib/config/schemas';
import { readHfConfig } from '../lib/model/hf';
import { readBatch } from '../lib/runfolder/batch';
import { buildSample } from '../lib/orchestrator/sample';
import { RunLayout } from '../lib/runfolder/layout';
import { readStepMetrics } from '../lib/runfolder/metrics';
import { TrainerRuntime } from '../lib/trainer/runtime';
import { rlTrainerSpec } from '../lib/trainer/spec';
import { readRollouts } from '../lib/runfolder/rollouts';
import { prepareRun } from '../activities/run';
import { closeStack, executeRl, type ServingStack, startStack } from './support/harness';
import { lowercaseEnv, rlConfig, serverRunArgs, smallStep, tempDir, tinyModel } from './support/setup';

const root = tempDir('prime-rl-replay-');
const moeDir = path.join(root, 'moe');
const denseDir = path.join(root, 'dense');
let stack: ServingStack;

function config(model: string, args: string[]): RLConfig {
  return rlConfig([...serverRunArgs(model, path.join(root, 'outputs'), `${stack.inference.url}/v1`), ...args]);
}

beforeAll(async () => {
  tinyModel(moeDir, { arch: 'qwen3_moe' });
  tinyModel(denseDir);
  stack = await startStack(root, { modelDir: moeDir, seqLen: 128 });
});
afterAll(() => closeStack(stack, root));

test('a dense model refuses router_replay at the start and in the trainer, naming the key', async () => {
  const cfg = config(denseDir, ['--run-name', 'dense', '--trainer.moe.router-replay']);
  const refusal = /trainer\.moe\.router_replay: the model \(qwen3\) has no MoE router to replay/;
  await expect(prepareRun(cfg)).rejects.toMatchObject({ message: expect.stringMatching(refusal), nonRetryable: true });
  await expect(TrainerRuntime.restore(path.join(root, 'dense-run'), rlTrainerSpec(cfg), 0)).rejects.toMatchObject({
    name: 'NonRetryableError',
    type: 'InvalidConfig',
    message: expect.stringMatching(refusal),
  });
});

test('rollouts keep the routes the server returned, batches carry them, and the trainer replays them (step 1 mismatch KL differs from recomputed routes)', async () => {
  // async_level 1: step 1 trains version-0 rollouts on version-1 weights (a stale policy), where
  // routes recomputed by the trainer can differ from inference's.
  const run = async (name: string, replay: boolean) => {
    const cfg = config(moeDir, [
      '--run-name',
      name,
      '--max-steps',
      '2',
      // Rewards that vary within a group from the start (reverse-text's are 0 for a random model): a real update.
      '--env',
      lowercaseEnv,
      '--async-level',
      '1',
      '--ckpt.interval',
      '100',
      ...smallStep(12),
      '--orchestrator.filter-zero-advantages',
      'false',
      '--trainer.optim.lr',
      '1e-2',
      ...(replay ? ['--trainer.moe.router-replay'] : []),
    ]);
    const result = await executeRl(stack, cfg);
    expect(result.steps).toBe(2);
    return { cfg, layout: RunLayout.of(cfg.output_dir, cfg.run_name) };
  };
  const replayed = await run('replay', true);
  const recomputed = await run('recompute', false);

  const arch = readHfConfig(moeDir).config;
  const width = arch.numLayers * arch.moe!.numExpertsPerTok; // every block is sparse in the tiny preset
  const rollouts = readRollouts(replayed.layout.rolloutsDir(0));
  expect(rollouts).toHaveLength(8);
  expect(rollouts.map((r) => r.error)).toEqual(new Array(8).fill(undefined));
  for (const r of readRollouts(recomputed.layout.rolloutsDir(0)))
    expect(r.samples.flat().some((s) => s.routes)).toBe(false);

  // The stored routes are the server's: the same request to the base model returns them again.
  // A sample's token t has the experts of the step that fed t; the last sampled token was never fed.
  await fetch(`${stack.inference.url}/reload_weights`, { method: 'POST' });
  const s = replayed.cfg.orchestrator.sampling;
  for (const r of rollouts) {
    const [prompt, completion] = r.samples[0];
    const res = await fetch(`${stack.inference.url}/v1/generate`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        prompt_token_ids: prompt.tokens,
        temperature: s.temperature,
        top_p: s.top_p,
        top_k: s.top_k,
        min_p: s.min_p,
        max_tokens: Math.min(128 - prompt.tokens.length, s.max_tokens!),
        seed: (r.seed + 1) % 2 ** 31,
        return_routes: true,
      }),
    });
    const body = (await res.json()) as {
      prompt_routes: number[][];
      choices: { token_ids: number[]; routes: number[][] }[];
    };
    expect(body.choices[0].token_ids).toEqual(completion.tokens);
    const server = [...body.prompt_routes, ...body.choices[0].routes].flat();
    expect(server).toHaveLength((prompt.tokens.length + completion.tokens.length - 1) * width);
    expect([...Array.from(prompt.routes!), ...Array.from(completion.routes!)]).toEqual([
      ...server,
      ...new Array<number>(width).fill(-1),
    ]);
  }

  // The batch rows hold each sample's tokens next to its routes (packing reorders samples).
  const key = (ids: ArrayLike<number>, routes: ArrayLike<number>) => `${Array.from(ids)}|${Array.from(routes)}`;
  const expected = rollouts.map((r) => {
    const sample = buildSample(r.samples[0], 0);
    return key(sample.inputIds, sample.routes!);
  });
  const packed = readBatch(replayed.layout.batchFile(0)).rows.flatMap((row) => {
    let at = 0;
    return Array.from(row.sampleLengths, (n) => {
      at += n;
      return key(row.inputIds.subarray(at - n, at), row.routes!.subarray((at - n) * width, at * width));
    });
  });
  expect(packed.sort()).toEqual(expected.sort());
  expect(readBatch(recomputed.layout.batchFile(0)).rows.every((row) => row.routes === undefined)).toBe(true);

  // Same rollouts (same seeds, version 0), so the mismatch differs by the routes alone.
  const tokens = (layout: RunLayout) =>
    readRollouts(layout.rolloutsDir(1)).map((r) => r.samples.flat().map((x) => x.tokens));
  expect(tokens(replayed.layout)).toEqual(tokens(recomputed.layout));
  const kl = (layout: RunLayout) => readStepMetrics(layout.metricsFile).map((l) => l.mismatch_kl as number);
  const [withReplay, without] = [kl(replayed.layout), kl(recomputed.layout)];
  for (const v of [...withReplay, ...without]) expect(Number.isFinite(v)).toBe(true);
  // Step 0 trains on the weights that sampled (both ~0); step 1 on a stale policy. Measured
  // (docs/algorithms.md): 0.0467 replayed vs 0.0470 recomputed, deterministic to 1e-8 across runs; most of it
  // is the update itself, which replay does not undo, and at lr 3e-2 replay came out higher. So the
  // check is that the two differ: the trainer used the stored routes, not its router's. That
  // replay lowers the mismatch when routes flip is test/native.moe.test.ts's (router replay).
  expect(withReplay[0]).toBeLessThan(1e-6);
  expect(without[0]).toBeLessThan(1e-6);
  expect(without[1]).toBeGreaterThan(1e-3);
  expect(Math.abs(withReplay[1] - without[1])).toBeGreaterThan(1e-6);
});
