/**
 * `prime-rl sft`: cpu and trainer workers, the `sft` workflow, and its summary; with evals
 * (eval.interval), also the inference server they sample from, serving each evaluated step's weights.
 */
import * as path from 'node:path';
import { inferenceSchema, type SFTConfig } from '../config/schemas';
import { readEvalResults, renderEvalTable } from '../eval';
import { writeReport } from '../report';
import { RunLayout } from '../runfolder/layout';
import { stepLine } from '../run-ops/progress';
import type { TrainMetrics } from '../trainer/types';
import { follow, trainParts } from './follow';
import { launch, type LaunchOptions, type LocalRun } from './launch';

/**
 * What the launcher reads of the `sft` workflow's `progress` query (workflows/sft.ts
 * `SftProgress`; test/launcher.test.ts checks that it fits).
 */
export interface SftProgressView {
  trained: number;
  /** Unknown while the run is prepared (its data decides it). */
  maxSteps?: number;
  paused: boolean;
  lastTrain?: { metrics: TrainMetrics };
  lastValLoss?: number;
}

/** What the launcher reads of the `sft` workflow's result (workflows/sft.ts `SftResult`). */
export interface SftResultView {
  runDir: string;
  steps: number;
  stoppedEarly: boolean;
  reachedTarget: boolean;
  lastTrain?: { metrics: TrainMetrics };
  lastValLoss?: number;
  weightsDir?: string;
}

/** The inference server of an SFT run's evals: the model, with the run's weights loadable. */
function evalServer(config: SFTConfig) {
  if (config.eval.interval === undefined) return undefined;
  return inferenceSchema.parse({
    model: { name: config.model.name, dtype: config.model.dtype, device: config.model.device },
    seq_len: config.seq_len,
    output_dir: config.output_dir,
    seed: config.seed,
    threads: config.threads,
    server: config.inference.server,
  });
}

/** An SFT run: cpu and trainer workers (and an inference server for its evals), the `sft` workflow. */
export function launchSft(config: SFTConfig, opts: LaunchOptions = {}): Promise<LocalRun<SftResultView>> {
  return launch<SftResultView>(
    {
      runName: config.run_name,
      outputDir: config.output_dir,
      temporal: config.temporal,
      inference: evalServer(config),
      pools: ['cpu', 'trainer'],
      worker: { env_workers: 1, env_timeout_s: 60, threads: config.threads },
      trainer: config.trainer,
      workflowType: 'sft',
      args: [config],
      memo: {
        runDir: path.resolve(RunLayout.of(config.output_dir, config.run_name).dir),
        model: config.model.name,
        maxSteps: config.max_steps ?? null,
      },
      progressLine: (p: SftProgressView, rate) =>
        stepLine(
          p.trained,
          p.maxSteps,
          rate,
          [...trainParts(p.lastTrain?.metrics), `val ${p.lastValLoss?.toFixed(4) ?? '-'}`],
          {
            paused: p.paused,
            // The run ends at the first validation at or below the target, maybe long before max_steps.
            mayEndEarly:
              config.val.target_loss !== undefined ? `sooner if val loss reaches ${config.val.target_loss}` : undefined,
          },
        ),
    },
    opts,
  );
}

/** The `sft` command. */
export async function runSft(config: SFTConfig, opts: LaunchOptions = {}): Promise<void> {
  const run = await launchSft(config, opts);
  await follow(run, config.run_name, (result) => {
    const m = result.lastTrain?.metrics;
    const evals = readEvalResults(result.runDir);
    process.stdout.write(
      `sft ${config.run_name} ${result.reachedTarget ? `reached val.target_loss ${config.val.target_loss}` : result.stoppedEarly ? 'stopped' : 'completed'}: ${result.steps} steps, last loss ${m?.loss.toFixed(4) ?? '-'}, val loss ${result.lastValLoss?.toFixed(4) ?? '-'}\n` +
        (evals.length > 0 ? `${renderEvalTable(evals)}\n` : '') +
        `  run folder: ${result.runDir}\n  weights:    ${result.weightsDir ?? '-'}\n  report:     ${writeReport(result.runDir)}\n`,
    );
  });
}
