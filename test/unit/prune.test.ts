/** What `ckpt.keep_last` removes from a run folder after a checkpoint (the saveCheckpoint activity). */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { RunLayout } from '../../lib/runfolder/layout';
import { pruneRunFolder } from '../../lib/run/prune';

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
