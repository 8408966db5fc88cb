/**
 * Run bookkeeping on the cpu queue: `prepareRun` checks a run's inputs and lays out its folder;
 * `recordStep` appends a finished step's metrics line (once, whatever the retries).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { Failure } from '../lib/failures';
import { writeFileAtomic } from '../lib/atomic';
import { rlSchema, type RLConfig } from '../lib/config/schemas';
import { checkConfig, storedConfigText } from '../lib/run/config';
import { rewindRun as rewind } from '../lib/run/rewind';
import { loadEnvironment } from '../lib/envs/loader';
import { readHfConfig } from '../lib/model/hf';
import { RunLayout } from '../lib/run/layout';
import { appendStepMetrics, withDocumentedNames } from '../lib/run/metrics';
import type { StepRecordInput } from './types';

/** Checks the model and environments, writes configs/rl.json; a rerun with the same config is a no-op. */
export async function prepareRun(config: RLConfig): Promise<{ runDir: string }> {
  checkConfig(config, rlSchema);
  const layout = RunLayout.of(config.output_dir, config.run_name);
  try {
    readHfConfig(path.resolve(config.model.name ?? config.trainer.model.name));
  } catch (e) {
    throw ApplicationFailure.nonRetryable(`model.name: ${(e as Error).message}`, Failure.InvalidModel);
  }
  if (config.env.length === 0) throw ApplicationFailure.nonRetryable('no environments configured: add an [[env]] table', Failure.InvalidConfig);
  for (const e of [...config.env, ...config.eval.env]) {
    try {
      loadEnvironment(e.id, e.args);
    } catch (err) {
      throw ApplicationFailure.nonRetryable((err as Error).message, Failure.InvalidEnvironment);
    }
  }
  const text = storedConfigText(config);
  if (fs.existsSync(layout.configFile)) {
    const stored = fs.readFileSync(layout.configFile, 'utf8');
    if (stored !== text) {
      throw ApplicationFailure.nonRetryable(
        `run folder ${layout.dir} holds a run with a different config (${layout.configFile}); use another run_name or output_dir`,
        Failure.ConfigMismatch,
      );
    }
  } else {
    fs.mkdirSync(path.dirname(layout.configFile), { recursive: true });
    writeFileAtomic(layout.configFile, text);
  }
  return { runDir: layout.dir };
}

/**
 * `ckpt.resume_step`: the run (rl or sft) continues from its checkpoint of `step`; what came after
 * is discarded (lib/run/rewind.ts). Called once per new start, before its first step.
 */
export async function rewindRun({ runDir, step }: { runDir: string; step: number }): Promise<{ weightsDir: string | null }> {
  return rewind(runDir, step, fs.existsSync(new RunLayout(runDir).sftConfigFile) ? 'sft' : 'rl');
}

/** One metrics.jsonl line per step, flat where a chart needs a series. */
export async function recordStep({ runDir, step, policyVersion, rollouts, batch, train, times }: StepRecordInput): Promise<void> {
  appendStepMetrics(new RunLayout(runDir).metricsFile, withDocumentedNames({
    step,
    policy_version: policyVersion,
    reward_mean: rollouts.rewardMean,
    reward_std: rollouts.rewardStd,
    rollouts: rollouts.rollouts,
    rollouts_errored: rollouts.errored,
    rollouts_truncated: rollouts.truncated,
    completion_tokens: rollouts.completionTokens,
    generate_seconds: rollouts.seconds,
    rubric: rollouts.rubric,
    samples: batch.counts.samples,
    rows: batch.counts.rows,
    groups_filtered: batch.advantages.groups - batch.advantages.groups_kept,
    filtered: batch.advantages.filtered,
    ...train.metrics,
    progress: train.progress,
    time: times,
  }));
}
