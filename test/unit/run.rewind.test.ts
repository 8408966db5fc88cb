/**
 * `ckpt.resume_step` on a run folder (lib/run-ops/rewind.ts): what comes after the checkpoint goes, in
 * in-flight mode the producer's unclaimed groups too (sampled by discarded policies).
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { rewindRun } from '../../lib/run-ops/rewind';
import { RunLayout } from '../../lib/runfolder/layout';
import { CKPT_FILE, fileSha256, PROGRESS_FILE } from '../../lib/runfolder/checkpoint';

const write = (file: string, text: string) => {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, text);
};

/** An in-flight run after 4 steps: step s claimed groups [2s, 2s + 2); groups 8..11 were made since. */
function inFlightRun(): RunLayout {
  const layout = new RunLayout(fs.mkdtempSync(path.join(os.tmpdir(), 'prime-rewind-')));
  for (const steps of [2, 4]) {
    const dir = layout.checkpointDir(steps);
    write(path.join(dir, CKPT_FILE), `state after ${steps} steps`);
    write(path.join(dir, PROGRESS_FILE), JSON.stringify({ steps, sha256: fileSha256(path.join(dir, CKPT_FILE)) }));
  }
  for (let step = 0; step < 4; step++) {
    write(
      layout.rolloutsSummaryFile(step),
      JSON.stringify({ step, inFlight: { first: 2 * step, next: 2 * step + 2 } }),
    );
    write(layout.batchFile(step), 'batch');
    write(layout.trainSummaryFile(step), '{}');
    write(path.join(layout.weightsDir(step + 1), 'model.safetensors'), 'weights');
  }
  for (let seq = 0; seq < 12; seq++) write(layout.inflightGroupFile(seq), JSON.stringify({ seq, draw: seq }));
  write(layout.inflightConsumedFile, JSON.stringify({ step: 4, next: 10 }));
  return layout;
}

const stepsOf = (dir: string) =>
  fs
    .readdirSync(dir)
    .map((n) => Number(/\d+/.exec(n)![0]))
    .sort((a, b) => a - b);

test('rewinding an in-flight run to step 2 keeps the groups steps 0 and 1 claimed and removes the rest', () => {
  const layout = inFlightRun();
  try {
    expect(rewindRun(layout.dir, 2, 'rl').weightsDir).toBe(layout.weightsDir(2));
    expect(stepsOf(path.dirname(layout.rolloutsDir(0)))).toEqual([0, 1]);
    expect(stepsOf(layout.checkpointsRoot)).toEqual([2]);
    expect(stepsOf(layout.weightsRoot)).toEqual([1, 2]);
    // Groups 4..11 were claimed by the discarded steps 2 and 3 or made after them, by policies 2..4 of
    // the discarded branch: the redone step 2 must not take them.
    expect(stepsOf(layout.inflightGroupsDir)).toEqual([0, 1, 2, 3]);
    expect(fs.existsSync(layout.inflightConsumedFile)).toBe(false);
  } finally {
    fs.rmSync(layout.dir, { recursive: true, force: true });
  }
});

test('rewinding to step 0 removes every group; a strict-mode run has none to remove', () => {
  const layout = inFlightRun();
  try {
    fs.rmSync(layout.checkpointDir(4), { recursive: true });
    const dir = layout.checkpointDir(0);
    write(path.join(dir, CKPT_FILE), 'initial state');
    write(path.join(dir, PROGRESS_FILE), JSON.stringify({ steps: 0, sha256: fileSha256(path.join(dir, CKPT_FILE)) }));
    rewindRun(layout.dir, 0, 'rl');
    expect(fs.readdirSync(layout.inflightGroupsDir)).toEqual([]);
    fs.rmSync(path.dirname(layout.inflightGroupsDir), { recursive: true });
    expect(() => rewindRun(layout.dir, 0, 'rl')).not.toThrow();
  } finally {
    fs.rmSync(layout.dir, { recursive: true, force: true });
  }
});

test('a missing or corrupt checkpoint is refused, listing only the checkpoints that verify and saying which are corrupt', () => {
  const layout = inFlightRun();
  try {
    write(path.join(layout.checkpointDir(4), CKPT_FILE), 'bit rot'); // its progress.json records another sha256
    const refusal = (step: number) => {
      try {
        rewindRun(layout.dir, step, 'rl');
      } catch (e) {
        return (e as Error).message;
      }
      throw new Error('expected a refusal');
    };
    const choices =
      /\(its checkpoints: 2; corrupt: 4 \(trainer\.ckpt: checksum mismatch \([0-9a-f]{12} != [0-9a-f]{12}\)\)\); pick one of those/;
    expect(refusal(3)).toMatch(/^ckpt\.resume_step: run \S+ has no checkpoint of step 3 /);
    expect(refusal(3)).toMatch(choices);
    expect(refusal(4)).toMatch(
      /^ckpt\.resume_step: checkpoint \S+step_4 is unusable: trainer\.ckpt: checksum mismatch/,
    );
    expect(refusal(4)).toMatch(choices);
    expect(stepsOf(layout.checkpointsRoot)).toEqual([2, 4]); // nothing was discarded
  } finally {
    fs.rmSync(layout.dir, { recursive: true, force: true });
  }
});
