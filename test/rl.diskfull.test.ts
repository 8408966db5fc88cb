/**
 * A run folder that fills up during a run (issue #42, "Full and slow disks"; #43's ENOSPC item):
 * the run folder is a tmpfs of a few MiB that fills within the first steps (weights, checkpoints,
 * batches, metrics lines, logs: whichever write comes first), then grows (`mount -o remount,size=`).
 * Every write fails whole (temp files removed, nothing torn committed), the activity fails naming
 * the folder and its free space, the launcher's progress line says the run waits for disk space,
 * and once there is space the run resumes by itself and completes: every step once, every file it
 * left readable.
 *
 * Needs root (mount): elsewhere it is skipped, saying so.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as native from '../native';
import { DiskFullError } from '../lib/atomic';
import { loadHfModel, readHfConfig, writeHfModel } from '../lib/model/hf';
import { writeBatch } from '../lib/runfolder/batch';
import { buildSample } from '../lib/orchestrator/sample';
import { packSamples } from '../lib/runfolder/packing';
import { listSteps, RunLayout } from '../lib/runfolder/layout';
import { appendStepMetrics } from '../lib/runfolder/metrics';
import { verifyCheckpoint } from '../lib/runfolder/checkpoint';
import { TrainerRuntime } from '../lib/trainer/runtime';
import { rlTrainerSpec } from '../lib/trainer/spec';
import { metricSteps, until } from './support/processes';
import { chaosScene, checkRun, tinyRunArgs } from './support/rl-chaos';
import { rlConfig } from './support/setup';

jest.setTimeout(8 * 60_000);

const { root, modelDir, outputDir, cli, stopAll } = chaosScene('prime-diskfull-');
const mount = (...args: string[]) => spawnSync('mount', args, { encoding: 'utf8' });

/** Why a tmpfs cannot be mounted here, or undefined when it can. */
function tmpfsUnusable(): string | undefined {
  if (process.getuid?.() !== 0) return 'not root';
  const probe = fs.mkdtempSync(path.join(outputDir, '..', 'probe-'));
  const made = mount('-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', probe);
  if (made.status !== 0) return `mount -t tmpfs failed: ${(made.stderr || made.error?.message || '').trim()}`;
  spawnSync('umount', [probe]);
  fs.rmdirSync(probe);
  return undefined;
}
const unusable = tmpfsUnusable();
if (unusable) console.warn(`test/rl.diskfull.test.ts skipped: no tmpfs can be mounted (${unusable})`);

/** Every path under `dir`. */
const walk = (dir: string): string[] =>
  fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    return e.isDirectory() ? [p, ...walk(p)] : [p];
  });

(unusable ? test.skip : test)(
  'a run folder that fills up: writes fail whole, the progress line says the run waits for disk space, and it resumes once there is space',
  async () => {
    const steps = 8;
    const args = ['rl', ...(await tinyRunArgs({ name: 'full', modelDir, outputDir, steps }))];
    const layout = RunLayout.of(outputDir, 'full');
    fs.mkdirSync(layout.dir, { recursive: true });
    // Room for a step or two: a weights folder is about 0.5 MiB, a checkpoint 1.4 MiB.
    const made = mount('-t', 'tmpfs', '-o', 'size=3m', 'tmpfs', layout.dir);
    expect(made.stderr).toBe('');
    try {
      const launcher = cli.start(args);
      const waiting = /waiting for disk space: no space left in (\S+) \((\S+ \S+) free of 3\.0 MiB\)/;
      await until(
        `the progress line to say the run waits for disk space\n${launcher.output().slice(-3000)}`,
        () => waiting.test(launcher.output()),
        240_000,
      );
      const [, folder] = waiting.exec(launcher.output())!;
      expect(folder.startsWith(layout.dir)).toBe(true);
      const stuck = metricSteps(layout.metricsFile).length;
      expect(stuck).toBeLessThan(steps);
      // Space comes back: the next retry of the failed activity succeeds, the run goes on.
      expect(mount('-o', 'remount,size=256m', layout.dir).stderr).toBe('');
      expect(await launcher.exited).toBe(0);
      expect(launcher.output()).toContain(`run full completed: ${steps} steps`);

      checkRun(layout, steps);
      // No failed write left a file behind (temp files of writers that failed are removed), and
      // whatever was committed is whole: every checkpoint verifies, every weights folder loads.
      expect(walk(layout.dir).filter((p) => /\.(tmp|old)-/.test(p))).toEqual([]);
      for (const c of listSteps(fs.readdirSync(layout.checkpointsRoot))) verifyCheckpoint(layout.checkpointDir(c));
      for (const v of listSteps(fs.readdirSync(layout.weightsRoot)))
        expect(loadHfModel(layout.weightsDir(v)).tensors.length).toBeGreaterThan(0);
    } finally {
      stopAll();
      spawnSync('umount', ['-l', layout.dir]);
    }
  },
);

(unusable ? test.skip : test)(
  'each kind of run-folder write on a full disk fails whole, naming the folder and its free space, and succeeds once there is space',
  async () => {
    native.setThreads(1);
    const disk = path.join(root, 'small');
    fs.mkdirSync(disk);
    expect(mount('-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', disk).stderr).toBe('');
    try {
      const layout = new RunLayout(path.join(disk, 'run'));
      fs.mkdirSync(path.dirname(layout.batchFile(0)), { recursive: true });
      appendStepMetrics(layout.metricsFile, { step: 0 });
      const metrics = fs.readFileSync(layout.metricsFile);
      // Fill the disk up (the filler's last write fails part way).
      const filler = path.join(disk, 'filler');
      expect(() => fs.writeFileSync(filler, Buffer.alloc(8 * 1024 * 1024))).toThrow(/ENOSPC/);

      const { tensors } = loadHfModel(modelDir);
      const rt = (await TrainerRuntime.restore(layout.dir, rlTrainerSpec(rlConfig(['--model.name', modelDir])), 0))
        .runtime;
      const sample = buildSample([{ tokens: [1, 2, 3], generated: true, logprobs: [-1, -1, -1] }], 1);
      const { rows, counts } = packSamples([sample], 16);
      const writes: [string, string, () => unknown][] = [
        // A line longer than what is left of its file's last page: the write is cut short.
        ['a metrics line', layout.dir, () => appendStepMetrics(layout.metricsFile, { step: 1, pad: 'x'.repeat(8192) })],
        ['a batch', path.dirname(layout.batchFile(0)), () => writeBatch(layout.batchFile(0), 0, 16, rows, counts)],
        [
          'weights',
          layout.weightsRoot,
          () => writeHfModel(layout.weightsDir(1), { config: readHfConfig(modelDir).rawConfig, tensors }),
        ],
        ['a checkpoint', layout.checkpointsRoot, () => rt.checkpoint()],
      ];
      for (const [what, folder, write] of writes) {
        const e = await Promise.resolve()
          .then(write)
          .then(
            () => undefined,
            (err: unknown) => err,
          );
        expect(`${what}: ${e instanceof DiskFullError ? 'DiskFullError' : String(e)}`).toBe(`${what}: DiskFullError`);
        expect((e as Error).message).toMatch(
          new RegExp(`^no space left in ${folder} \\(\\S+ \\S+ free of 4\\.0 MiB\\): `),
        );
      }
      // Nothing torn or half-written is left to be read: the metrics file is as before, no batch,
      // weights or checkpoint, no temp file.
      expect(fs.readFileSync(layout.metricsFile).equals(metrics)).toBe(true);
      expect(walk(layout.dir).filter((p) => !fs.statSync(p).isDirectory())).toEqual([layout.metricsFile]);

      fs.rmSync(filler);
      for (const [, , write] of writes) await write();
      expect(fs.readFileSync(layout.metricsFile, 'utf8').split('\n')).toHaveLength(3);
    } finally {
      spawnSync('umount', ['-l', disk]);
    }
  },
);
