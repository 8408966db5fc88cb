/** `prime-rl rl`: inference server, cpu and trainer workers, the `rl` workflow, and its summary. */
import * as path from 'node:path';
import type { RLConfig } from '../config/schemas';
import { readEvalResults, renderEvalTable } from '../eval';
import { writeReport } from '../report';
import { RunLayout } from '../runfolder/layout';
import { stepLine } from '../run/progress';
import { startWandb } from '../run/wandb';
import type { TrainMetrics } from '../trainer/types';
import { follow, trainParts } from './follow';
import { launch, type LocalRun } from './launch';

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
export function launchRun(config: RLConfig, opts: { quiet?: boolean } = {}): Promise<LocalRun<RlResultView>> {
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

/** The `rl` command: launch, follow, summarise (with its evals and report), clean up. */
export async function runRl(config: RLConfig): Promise<void> {
  const run = await launchRun(config);
  // No [wandb] section: no W&B, nothing to say (the user did not ask for it).
  const wandb =
    config.wandb &&
    (await startWandb({
      settings: config.wandb,
      runName: config.run_name,
      runDir: run.layout.dir,
      metricsFile: run.layout.metricsFile,
      config,
      say: (line) => process.stderr.write(`${line}\n`),
    }));
  try {
    await followRl(run, config);
  } finally {
    await wandb?.close();
  }
}

function followRl(run: LocalRun<RlResultView>, config: RLConfig): Promise<void> {
  return follow(run, config.run_name, (result) => {
    const evals = readEvalResults(result.runDir);
    process.stdout.write(
      `run ${config.run_name} ${result.stoppedEarly ? 'stopped' : 'completed'}: ${result.steps} steps, last reward ${result.lastReward?.toFixed(3) ?? '-'}\n` +
        (evals.length > 0 ? `${renderEvalTable(evals)}\n` : '') +
        `  run folder: ${result.runDir}\n  metrics:    ${run.layout.metricsFile}\n  report:     ${writeReport(result.runDir)}\n`,
    );
  });
}
