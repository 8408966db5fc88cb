/**
 * What `ckpt.keep_last` removes from a run folder after a checkpoint (the saveCheckpoint activity),
 * and the policy folders no server needs any more (recordStep).
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { RunLayout } from '../../lib/runfolder/layout';
import { writeEvalResults } from '../../lib/eval/results';
import { firstNeededVersion, prunePolicyWeights, pruneRunFolder } from '../../lib/run-ops/prune';

let root: string;
beforeEach(() => (root = fs.mkdtempSync(path.join(os.tmpdir(), 'prune-'))));
afterEach(() => fs.rmSync(root, { recursive: true, force: true }));

/** A run folder after `steps` train steps with checkpoints at `ckpts`: batches, weights, checkpoints. */
function runFolder(steps: number, ckpts: number[]): RunLayout {
  const layout = new RunLayout(root);
  for (let s = 0; s < steps; s++) {
    fs.mkdirSync(path.dirname(layout.batchFile(s)), { recursive: true });
    fs.writeFileSync(layout.batchFile(s), 'batch');
    fs.mkdirSync(layout.weightsDir(s + 1), { recursive: true });
  }
  for (const c of ckpts) fs.mkdirSync(layout.checkpointDir(c), { recursive: true });
  return layout;
}

const steps = (dir: string) =>
  fs
    .readdirSync(dir)
    .map((n) => Number(/^step_(\d+)/.exec(n)?.[1]))
    .sort((a, b) => a - b);

test('keep_last = 2: the two newest checkpoints, the batches a replay from the older needs, the weights in-flight rollouts need', () => {
  const layout = runFolder(10, [2, 4, 6, 8, 10]);
  pruneRunFolder(layout, 2, 1);
  expect(steps(layout.checkpointsRoot)).toEqual([8, 10]);
  // A restore from checkpoint 8 replays batches 8 and 9.
  expect(steps(path.dirname(layout.batchFile(0)))).toEqual([8, 9]);
  // Rollouts of step 8 (async_level 1) used policy 7: weights from version 7 on stay.
  expect(steps(layout.weightsRoot)).toEqual([7, 8, 9, 10]);
});

test('keep_last unset keeps everything; a second prune removes nothing more', () => {
  const layout = runFolder(4, [2, 4]);
  pruneRunFolder(layout, undefined, 1);
  expect(steps(layout.checkpointsRoot)).toEqual([2, 4]);
  expect(steps(layout.weightsRoot)).toEqual([1, 2, 3, 4]);
  pruneRunFolder(layout, 1, 0);
  pruneRunFolder(layout, 1, 0);
  expect(steps(layout.checkpointsRoot)).toEqual([4]);
  expect(steps(path.dirname(layout.batchFile(0)))).toEqual([]);
  expect(steps(layout.weightsRoot)).toEqual([4]);
});

test("policy folders: those below the version the recorded step sampled from go, except each checkpoint's and the async_level before it", () => {
  const layout = runFolder(10, [4, 8]); // weights 1..10
  // Step 9 recorded, sampled from version 8 (async_level 1): versions 1..7 are behind every server.
  expect(prunePolicyWeights(layout, 8, 1)).toEqual([1, 2, 5, 6]);
  // A resume from checkpoint 4 samples step 4 from version 3; from 8, step 8 from 7.
  expect(steps(layout.weightsRoot)).toEqual([3, 4, 7, 8, 9, 10]);
  expect(prunePolicyWeights(layout, 8, 1)).toEqual([]); // idempotent
});

test('an eval due keeps the version it evaluates', () => {
  const layout = runFolder(10, []);
  writeEvalResults(layout.dir, { model: 'base', step: null, environments: {} });
  writeEvalResults(layout.dir, { model: 'step_3', step: 3, environments: {} });
  // eval.interval 3: the evals of versions 0 and 3 are done, version 6's is due.
  expect(firstNeededVersion(layout, 8, 3)).toBe(6);
  expect(firstNeededVersion(layout, 5, 3)).toBe(5);
  expect(firstNeededVersion(layout, 8, undefined)).toBe(8);
  prunePolicyWeights(layout, firstNeededVersion(layout, 8, 3), 0);
  expect(steps(layout.weightsRoot)).toEqual([6, 7, 8, 9, 10]);
});
