/**
 * Damaged run folders in a trainer's replay (issue #42): a restore that meets a truncated or
 * corrupt batch (and skips a truncated newest checkpoint) packs the batch again from the step's
 * rollouts, to the same bytes, and ends with the weights of an undamaged run; where the rollouts are
 * gone it stops with `RunFolderDamaged` naming the batch. Before, the restore failed with the
 * safetensors error, and Temporal retried `trainStep` with it for ever.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as native from '../native';
import { writeFileAtomic } from '../lib/atomic';
import { Failure, RunFolderDamagedError } from '../lib/failures';
import { Rng } from '../lib/model/rng';
import { readSafetensorsDir } from '../lib/model/safetensors';
import { readBatch } from '../lib/runfolder/batch';
import { repackStepBatch } from '../lib/orchestrator/repack';
import { buildStepBatch, stepBatchInput } from '../lib/orchestrator/step-batch';
import { storedConfigText } from '../lib/runfolder/config';
import { RunLayout } from '../lib/runfolder/layout';
import { rlTrainerSpec } from '../lib/trainer/spec';
import { TrainerRuntime } from '../lib/trainer/runtime';
import { rlConfig, tinyModel } from './support/setup';

native.setThreads(1);

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-damaged-'));
const modelDir = path.join(root, 'model');
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));
beforeAll(() => tinyModel(modelDir));

const STEPS = 5;
const config = rlConfig([
  '--model.name',
  modelDir,
  '--seq-len',
  '64',
  '--max-steps',
  String(STEPS),
  '--trainer.optim.lr',
  '1e-3',
]);

/**
 * An rl run folder as the cpu worker leaves it: its config, and per step a rollouts folder (two
 * groups of two random rollouts, in the stored format) packed into its batch by the real packing.
 */
function runFolder(name: string): RunLayout {
  const layout = new RunLayout(path.join(root, name));
  fs.mkdirSync(path.dirname(layout.configFile), { recursive: true });
  writeFileAtomic(layout.configFile, storedConfigText(config));
  const rng = new Rng(11);
  for (let step = 0; step < STEPS; step++) {
    const rollouts = Array.from({ length: 4 }, (_, i) => {
      const prompt = Array.from({ length: 4 + rng.int(6) }, () => rng.int(256));
      const completion = Array.from({ length: 3 + rng.int(8) }, () => rng.int(256));
      return {
        group: i >> 1,
        reward: rng.uniform(),
        completionTokens: completion.length,
        turns: 1,
        samples: [
          [
            { tokens: prompt, generated: false },
            { tokens: completion, generated: true, logprobs: completion.map(() => -1 - rng.uniform() * 3) },
          ],
        ],
      };
    });
    fs.mkdirSync(layout.rolloutsDir(step), { recursive: true });
    fs.writeFileSync(layout.rolloutsFile(step), rollouts.map((r) => `${JSON.stringify(r)}\n`).join(''));
    fs.writeFileSync(layout.rolloutsSummaryFile(step), '{}');
    buildStepBatch(stepBatchInput(config, layout, step));
  }
  return layout;
}

const weightsOf = (dir: string) => new Map(readSafetensorsDir(dir).map((t) => [t.name, t.data]));

/** Cuts `file` to half its length, as a disk that lost its end (or a copy cut short) leaves it. */
const truncate = (file: string) => fs.truncateSync(file, fs.statSync(file).size >> 1);

test('a replay rebuilds a truncated or corrupt batch from its rollouts, or stops naming it when they are gone', async () => {
  const spec = rlTrainerSpec(config);
  const layout = runFolder('run');
  const rt = (await TrainerRuntime.restore(layout.dir, spec, 0)).runtime;
  for (let s = 0; s < STEPS; s++) {
    await rt.train(s);
    if (s === 1 || s === 3) await rt.checkpoint();
  }
  const expected = weightsOf(await rt.writeWeights(STEPS));
  const original = (s: number) => fs.readFileSync(layout.batchFile(s));
  const [batch2, batch3] = [original(2), original(3)];

  // The probe's case: the newest checkpoint and a batch the replay needs both truncated, and
  // another batch with one byte flipped (it still parses: its checksum tells).
  truncate(path.join(layout.checkpointDir(4), 'trainer.ckpt'));
  truncate(layout.batchFile(3));
  const flipped = Buffer.from(batch2);
  flipped[flipped.length - 3] ^= 0x01;
  fs.writeFileSync(layout.batchFile(2), flipped);

  const { runtime, report } = await TrainerRuntime.restore(layout.dir, spec, STEPS, { repack: repackStepBatch });
  expect(report.from).toBe(2);
  expect(report.skipped).toHaveLength(1);
  expect(report.rebuilt).toHaveLength(2);
  expect(report.rebuilt[0]).toContain(`${layout.batchFile(2)} is damaged`);
  expect(report.rebuilt[1]).toContain(`${layout.batchFile(3)} is damaged`);
  expect(report.rebuilt[1]).toContain(`rebuilt from ${layout.rolloutsDir(3)}`);
  expect(original(2).equals(batch2)).toBe(true);
  expect(original(3).equals(batch3)).toBe(true);
  expect(weightsOf(await runtime.writeWeights(STEPS))).toEqual(expected);

  // The trainer reads batches; packing one is the orchestrator's, passed in: a trainer given no
  // packer stops at a damaged batch, naming it, and leaves the file as it is.
  truncate(layout.batchFile(3));
  const damaged = fs.readFileSync(layout.batchFile(3));
  await expect(TrainerRuntime.restore(layout.dir, spec, STEPS)).rejects.toThrow(
    new RegExp(
      `^${layout.batchFile(3)} is damaged: .*; it cannot be rebuilt: this trainer process was given no packer`,
    ),
  );
  expect(fs.readFileSync(layout.batchFile(3)).equals(damaged)).toBe(true);

  // Without its rollouts a damaged batch cannot be rebuilt: the run stops, naming the file, for
  // good (non-retryable) instead of failing the same way at every retry.
  fs.rmSync(layout.rolloutsDir(3), { recursive: true });
  const failed = TrainerRuntime.restore(layout.dir, spec, STEPS, { repack: repackStepBatch });
  await expect(failed).rejects.toThrow(RunFolderDamagedError);
  await expect(failed).rejects.toMatchObject({ type: Failure.RunFolderDamaged });
  await expect(failed).rejects.toThrow(
    new RegExp(`^${layout.batchFile(3)} is damaged: .*; it cannot be rebuilt: the step's rollouts \\(.*\\) are gone$`),
  );
  // A batch that is simply gone is damage as well, and rebuilt alike.
  fs.rmSync(layout.batchFile(1));
  expect(() => readBatch(layout.batchFile(1))).toThrow(`${layout.batchFile(1)} is damaged: the file is gone`);
});
