/**
 * `prime-rl rl` with [slurm] (lib/config/schemas/slurm.ts): outside a SLURM job it renders the
 * run's sbatch script into `<run>/slurm/` beside the resolved config the job runs, and submits it
 * (`--dry-run`: only writes them). Inside the job (`SLURM_JOB_ID` set) the launcher runs the run
 * with each process a job step (`jobStep` below, LaunchOptions.jobSteps): a step that ends (scancel
 * of the step, a node's hiccup) is started again by the launcher's supervision, as a local process is.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { RLConfig } from '../config/schemas';
import { CommandError, ConfigError } from '../failures';
import { projectRoot } from '../paths';
import { RunLayout } from '../runfolder/layout';
import { writeJson } from './supervise';

export const DEFAULT_SBATCH_TEMPLATE = path.join(projectRoot, 'templates', 'slurm', 'rl.sbatch');

/** `s` as one shell word. */
const shellWord = (s: string) => (/^[A-Za-z0-9_./:@%+=,-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);

/** Where a run's job files go. */
export function slurmFiles(config: RLConfig): { script: string; config: string; output: string } {
  const layout = RunLayout.of(path.resolve(config.output_dir), config.run_name);
  return {
    script: path.join(layout.dir, 'slurm', 'rl.sbatch'),
    config: path.join(layout.dir, 'slurm', 'rl.json'),
    output: path.join(layout.logsDir, 'slurm-%j.out'),
  };
}

/** The job's script: `template` (the file's text) with its {{placeholders}} filled in. */
export function renderSbatch(config: RLConfig, template: string, templateName: string): string {
  const slurm = config.slurm!;
  const files = slurmFiles(config);
  const options = (['partition', 'account', 'time', 'nodelist', 'exclude'] as const)
    .filter((k) => slurm[k] !== undefined)
    .map((k) => `#SBATCH --${k}=${slurm[k]}`);
  // One node: a GPU per trainer rank and per inference server, where they run on CUDA.
  const gpus =
    (config.trainer.model.device.startsWith('cuda') ? config.trainer.world_size : 0) +
    (config.inference.model.device.startsWith('cuda') ? config.inference.replicas : 0);
  if (gpus > 0) options.push(`#SBATCH --gpus-per-node=${gpus}`);
  const values: Record<string, string> = {
    job_name: slurm.job_name,
    output: shellWord(files.output),
    sbatch_options: options.join('\n'),
    project_dir: shellWord(path.resolve(slurm.project_dir)),
    pre_run_command: slurm.pre_run_command ?? '',
    node: shellWord(process.execPath),
    config: shellWord(files.config),
    run_name: config.run_name,
  };
  return template.replace(/\{\{\s*([A-Za-z_]+)\s*\}\}/g, (_, name: string) => {
    const v = values[name];
    if (v === undefined)
      throw new ConfigError(
        `slurm.template_path: ${templateName} has the placeholder {{${name}}}, which is none of ours (${Object.keys(values).join(', ')})`,
      );
    return v;
  });
}

/** Writes the job's script and the config it runs; returns their paths. */
export function writeSlurmJob(config: RLConfig): { script: string; config: string; output: string } {
  const templateFile = config.slurm?.template_path ?? DEFAULT_SBATCH_TEMPLATE;
  let template: string;
  try {
    template = fs.readFileSync(templateFile, 'utf8');
  } catch (e) {
    throw new ConfigError(`slurm.template_path: cannot read ${templateFile}: ${(e as Error).message}`);
  }
  const files = slurmFiles(config);
  const script = renderSbatch(config, template, templateFile);
  fs.mkdirSync(path.dirname(files.output), { recursive: true });
  writeJson(files.config, config);
  fs.writeFileSync(files.script, script, { mode: 0o755 });
  return files;
}

/** Submits the run as a batch job (sbatch); returns the job id. */
export function submitSlurmJob(config: RLConfig, say: (line: string) => void): string {
  const files = writeSlurmJob(config);
  const r = spawnSync('sbatch', ['--parsable', files.script], { encoding: 'utf8', timeout: 60_000 });
  if (r.error)
    throw new CommandError(
      `[slurm]: sbatch could not run (${r.error.message}): submit from a host with SLURM's commands, or give --dry-run to write ${files.script} only`,
    );
  if (r.status !== 0) throw new CommandError(`[slurm]: sbatch refused ${files.script}: ${r.stderr.trim()}`);
  const job = r.stdout.trim().split(';')[0]!;
  say(
    `submitted batch job ${job} (${files.script})\n  follow it: npx prime-rl runs show ${config.run_name}; squeue -s -j ${job}\n  its log:   ${files.output.replace('%j', job)}`,
  );
  return job;
}

/** Whether this process runs inside a SLURM job (where [slurm] runs the run instead of submitting it). */
export const insideSlurmJob = () => process.env.SLURM_JOB_ID !== undefined;

/**
 * The command line that starts `argv` (node and its arguments) as a job step of the current job:
 * one task on one node of the allocation, sharing its CPUs with the other steps (`--overlap`).
 */
export function jobStep(name: string, argv: string[]): string[] {
  return ['srun', '--overlap', '--nodes=1', '--ntasks=1', `--job-name=${name}`, '--quiet', ...argv];
}
