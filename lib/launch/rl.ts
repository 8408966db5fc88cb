/** `prime-rl rl`: inference server, cpu and trainer workers, the `rl` workflow, and its summary. */
import * as path from 'node:path';
import type { RLConfig } from '../config/schemas';
import { readEvalResults, renderEvalTable } from '../eval';
import { writeReport } from '../report';
import { RunLayout } from '../runfolder/layout';
import { stepLine } from '../run-ops/progress';
import type { TrainMetrics } from '../trainer/types';
import { follow, trainParts } from './follow';
import { launch, type LaunchOptions, type LocalRun } from './launch';
import { insideSlurmJob, submitSlurmJob } from './slurm';

/**
 * What the launcher reads of the `rl` workflow's `progress` query (workflows/rl.ts `RLProgress`;
 * test/launcher.test.ts checks that it fits).
 */
export interface RlProgressView {
  trained: number;
  maxSteps?: number;
  paused: boolean;
  lastReward?: number;
  lastTrain?: { metrics: TrainMetrics };
}

/** What the launcher reads of the `rl` workflow's result (workflows/rl.ts `RLResult`). */
export interface RlResultView {
  runDir: string;
  steps: number;
  stoppedEarly: boolean;
  lastReward?: number;
}

/** An RL run: inference server, cpu and trainer workers, the `rl` workflow. */
export function launchRun(config: RLConfig, opts: LaunchOptions = {}): Promise<LocalRun<RlResultView>> {
  return launch<RlResultView>(
    {
      runName: config.run_name,
      outputDir: config.output_dir,
      temporal: config.temporal,
      inference: config.inference,
      pools: ['cpu', 'trainer'],
      worker: {
        env_workers: config.orchestrator.env_workers,
        env_timeout_s: config.orchestrator.env_timeout_s,
        threads: config.trainer.threads,
      },
      trainer: config.trainer,
      workflowType: 'rl',
      args: [config],
      memo: {
        runDir: path.resolve(RunLayout.of(config.output_dir, config.run_name).dir),
        model: config.model.name ?? '',
        maxSteps: config.max_steps ?? null,
      },
      // The servers its rollouts go to, run here or elsewhere.
      samplesFrom: (config.orchestrator.base_urls ?? []).map((u) => u.replace(/\/v1\/?$/, '')),
      progressLine: (p: RlProgressView, rate) =>
        stepLine(
          p.trained,
          p.maxSteps,
          rate,
          [`reward ${p.lastReward?.toFixed(3) ?? '-'}`, ...trainParts(p.lastTrain?.metrics)],
          { paused: p.paused },
        ),
    },
    opts,
  );
}

/**
 * The `rl` command: launch, follow, summarise (with its evals and report), clean up. W&B ([wandb])
 * is the workflow's (activities/wandb.ts), whoever starts the run.
 */
export async function runRl(config: RLConfig, opts: LaunchOptions = {}): Promise<void> {
  // [slurm]: submitted as a batch job, unless this is that job (lib/launch/slurm.ts).
  if (config.slurm && !opts.external) {
    if (!insideSlurmJob()) return void submitSlurmJob(config, (line) => process.stdout.write(`${line}\n`));
    opts = { ...opts, jobSteps: true };
  }
  const run = await launchRun(config, opts);
  await follow(run, config.run_name, (result) => {
    const evals = readEvalResults(result.runDir);
    process.stdout.write(
      `run ${config.run_name} ${result.stoppedEarly ? 'stopped' : 'completed'}: ${result.steps} steps, last reward ${result.lastReward?.toFixed(3) ?? '-'}\n` +
        (evals.length > 0 ? `${renderEvalTable(evals)}\n` : '') +
        `  run folder: ${result.runDir}\n  metrics:    ${run.layout.metricsFile}\n  report:     ${writeReport(result.runDir)}\n`,
    );
  });
}
