/**
 * [slurm] (issue #48 item 2): `prime-rl rl` with a [slurm] table renders the run's sbatch script
 * from the template into the run folder (`--dry-run` writes it without submitting), and submits
 * it. On a real SLURM (Debian's slurm-wlm with munge, started by the test: test/support/slurm.ts)
 * a debug run submitted so completes, its processes each a job step, and survives `scancel` of
 * the cpu worker's step: the launcher starts the step again and the run goes on, every step once.
 *
 * The cluster needs root and the packages (`bash scripts/setup.sh --tests`): elsewhere the
 * submission test is skipped, saying why; the rendering tests run everywhere.
 */
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { projectRoot } from '../lib/paths';
import { RunLayout } from '../lib/runfolder/layout';
import { metricSteps, until } from './support/processes';
import { chaosScene, checkRun, tinyRunArgs } from './support/rl-chaos';
import { slurmUnusable, startSlurm, type SlurmCluster } from './support/slurm';

jest.setTimeout(10 * 60_000);

const { root, modelDir, outputDir, cli } = chaosScene('prime-slurm-');
const prime = (args: string[], env: NodeJS.ProcessEnv = process.env) =>
  promisify(execFile)(process.execPath, [path.join(projectRoot, 'bin', 'prime-rl.js'), ...args], {
    env,
    encoding: 'utf8',
  });
const slurmArgs = (job: string) => [
  '--slurm.job-name',
  job,
  '--slurm.partition',
  'debug',
  '--slurm.time',
  '00:20:00',
  '--slurm.project-dir',
  projectRoot,
];

test('--dry-run writes the sbatch script and the config it runs, submitting nothing', async () => {
  const args = await tinyRunArgs({ name: 'dry', modelDir, outputDir, steps: 2 });
  const { stderr } = await prime(['rl', ...args, ...slurmArgs('prl-dry'), '--dry-run']);
  const layout = RunLayout.of(outputDir, 'dry');
  const script = path.join(layout.dir, 'slurm', 'rl.sbatch');
  expect(stderr).toContain(`sbatch script written, not submitted: ${script}`);
  const text = fs.readFileSync(script, 'utf8');
  expect(text).toMatch(/^#!\/bin\/bash\n/);
  for (const line of [
    '#SBATCH --job-name=prl-dry',
    '#SBATCH --partition=debug',
    '#SBATCH --time=00:20:00',
    `#SBATCH --output=${path.join(layout.logsDir, 'slurm-%j.out')}`,
    `cd ${projectRoot}`,
    `exec ${process.execPath} bin/prime-rl.js rl @ ${path.join(layout.dir, 'slurm', 'rl.json')}`,
  ])
    expect(text).toContain(line);
  const config = JSON.parse(fs.readFileSync(path.join(layout.dir, 'slurm', 'rl.json'), 'utf8'));
  expect(config).toMatchObject({ run_name: 'dry', max_steps: 2, slurm: { job_name: 'prl-dry' } });
  expect(fs.existsSync(layout.metricsFile)).toBe(false); // nothing ran
});

test('a template of your own: its placeholders filled in; one that is not ours is refused by name', async () => {
  const args = await tinyRunArgs({ name: 'tmpl', modelDir, outputDir, steps: 2 });
  const own = path.join(root, 'own.sbatch');
  fs.writeFileSync(
    own,
    '#!/bin/bash\n#SBATCH --job-name={{job_name}}\nmodule load node\nexec {{ node }} x {{config}}\n',
  );
  await prime(['rl', ...args, ...slurmArgs('prl-own'), '--slurm.template-path', own, '--dry-run']);
  const text = fs.readFileSync(path.join(RunLayout.of(outputDir, 'tmpl').dir, 'slurm', 'rl.sbatch'), 'utf8');
  expect(text).toContain('#SBATCH --job-name=prl-own\nmodule load node\nexec ');
  fs.writeFileSync(own, '#SBATCH --job-name={{job_name}}\n#SBATCH --gres={{gres}}\n');
  const refused = prime(['rl', ...args, '--slurm.template-path', own, '--dry-run']);
  await expect(refused).rejects.toMatchObject({ code: 2 });
  await expect(refused).rejects.toMatchObject({
    stderr: expect.stringMatching(
      /slurm\.template_path: .*own\.sbatch has the placeholder \{\{gres\}\}, which is none of ours/,
    ),
  });
});

test("[slurm] is rl's: sft refuses it by name, and slurm.dry_run points to --dry-run", async () => {
  const sft = prime(['sft', '--model.name', modelDir, '--slurm.job-name', 'x', '--dry-run']);
  await expect(sft).rejects.toMatchObject({
    code: 2,
    stderr: expect.stringMatching(/slurm.*SLURM jobs of this command/s),
  });
  const args = await tinyRunArgs({ name: 'dryflag', modelDir, outputDir, steps: 2 });
  const toml = path.join(root, 'dry-run.toml');
  fs.writeFileSync(toml, '[slurm]\njob_name = "x"\ndry_run = true\n');
  const rl = prime(['rl', '@', toml, ...args, '--dry-run']);
  await expect(rl).rejects.toMatchObject({ code: 2, stderr: expect.stringMatching(/slurm\.dry_run.*give --dry-run/s) });
});

const unusable = slurmUnusable();
if (unusable) console.warn(`test/slurm.test.ts: the submission test skipped: no SLURM cluster here (${unusable})`);

(unusable ? test.skip : test)(
  'a debug run submitted to SLURM completes, and survives scancel of its cpu worker step',
  async () => {
    let cluster: SlurmCluster | undefined;
    try {
      cluster = await startSlurm(path.join(root, 'slurm'));
      const steps = 8;
      const args = await tinyRunArgs({ name: 'job', modelDir, outputDir, steps });
      const layout = RunLayout.of(outputDir, 'job');
      // SLURM_CONF names the cluster; the job inherits it from sbatch.
      const submit = cli.start(
        ['rl', ...args, ...slurmArgs('prl-job')],
        ['env', `SLURM_CONF=${cluster.env.SLURM_CONF}`],
      );
      expect(await submit.exited).toBe(0);
      const job = /submitted batch job (\d+)/.exec(submit.output())![1]!;
      const steps_ = () =>
        cluster!
          .run('squeue', ['-h', '-s', '-j', job, '-o', '%i %j'])
          .trim()
          .split('\n')
          .filter(Boolean)
          .map((l) => l.split(' ') as [string, string]);
      await until('the cpu worker running as a job step', () => steps_().some(([, n]) => n === 'cpu'), 180_000);
      await until('two steps trained', () => metricSteps(layout.metricsFile).length >= 2, 300_000);
      const [cpuStep] = steps_().find(([, n]) => n === 'cpu')!;
      cluster.run('scancel', [cpuStep]);
      await until(
        'the cpu worker a job step again',
        () => steps_().some(([id, n]) => n === 'cpu' && id !== cpuStep),
        120_000,
      );
      await until('the job to end', () => cluster!.run('squeue', ['-h', '-j', job]).trim() === '', 400_000);
      const log = fs.readFileSync(path.join(layout.logsDir, `slurm-${job}.out`), 'utf8');
      expect(log).toMatch(/cpu worker exited \(.*\); restarting/);
      expect(log).toMatch(/run job completed: 8 steps/);
      checkRun(layout, steps);
    } finally {
      await cluster?.stop();
    }
  },
);
