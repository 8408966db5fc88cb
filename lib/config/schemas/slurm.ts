/**
 * [slurm] (rl), in prime-rl's spelling: a table that makes `prime-rl rl` submit the run as a SLURM
 * batch job instead of running it here. The script is rendered from a template (ours:
 * templates/slurm/rl.sbatch, or `template_path`) into the run folder; `--dry-run` writes it without
 * submitting. Inside the job (`SLURM_JOB_ID` set) the same command runs the run, each of its
 * processes a job step of its own (lib/launch/slurm.ts).
 */
import { z } from 'zod';

/** An sbatch option's value: one line, no shell metacharacters (it lands in `#SBATCH --key=value`). */
const sbatchValue = (what: string) =>
  z
    .string()
    .min(1)
    .regex(/^[A-Za-z0-9_.,:+@%=\-[\]/]+$/, `${what}: letters, digits and _ . , : + @ % = - [ ] / only`);

export const slurmSchema = z.strictObject({
  job_name: sbatchValue('job_name').default('prime-rl').describe('the job name (sbatch --job-name)'),
  project_dir: z
    .string()
    .min(1)
    .default('.')
    .describe("the project's folder on the cluster's nodes, where the job runs prime-rl from"),
  template_path: z
    .string()
    .min(1)
    .optional()
    .describe(
      'an sbatch script template of your own, with {{placeholders}} (docs/cluster.md, "SLURM"); default: templates/slurm/rl.sbatch',
    ),
  partition: sbatchValue('partition').optional().describe("sbatch --partition (default: the cluster's)"),
  account: sbatchValue('account').optional().describe('sbatch --account'),
  time: sbatchValue('time').optional().describe('sbatch --time: the wall-time limit, e.g. "24:00:00"'),
  nodelist: sbatchValue('nodelist').optional().describe('sbatch --nodelist'),
  exclude: sbatchValue('exclude').optional().describe('sbatch --exclude'),
  pre_run_command: z
    .string()
    .optional()
    .describe('a shell command the job runs before the run (module loads, clean-up)'),
});

export type SlurmConfig = z.output<typeof slurmSchema>;
