/**
 * `packBatch` (cpu queue): step n's rollouts become trainer input (lib/orchestrator/step-batch.ts:
 * errored rollouts dropped, advantages (zero ones dropped), first-fit-decreasing packing into rows of
 * seq_len), written as `batches/step_n.safetensors`. Idempotent by (run, step).
 *
 * The work is CPU-bound (seconds for thousands of long rollouts), so it runs in a worker thread and
 * this thread heartbeats meanwhile. A step with nothing to train fails the run non-retryably
 * instead of being recorded as if it had trained.
 */
import { ApplicationFailure } from '@temporalio/common';
import { Failure } from '../lib/failures';
import type { PackCounts } from '../lib/runfolder/packing';
import type { AdvantageMetrics } from '../lib/orchestrator/advantages';
import { isPluginError } from '../lib/orchestrator/plugins';
import { isPromptTooLong } from '../lib/orchestrator/token-rollout';
import { stepBatchInput, type StepBatchResult } from '../lib/orchestrator/step-batch';
import { readRunConfig } from '../lib/runfolder/config';
import { RunLayout } from '../lib/runfolder/layout';
import { readRollouts } from '../lib/runfolder/rollouts';
import { libModule } from '../lib/thread';
import { inThreadWithHeartbeat } from '../lib/temporal/heartbeat';

export interface PackInput {
  runDir: string;
  step: number;
}

export interface PackSummary {
  step: number;
  path: string;
  counts: PackCounts;
  advantages: AdvantageMetrics;
  /** Distilling: the step's `teacher_kl` (mean reverse KL to the teacher over the tokens it scored). */
  distill?: { teacher_kl: number; tokens: number };
}

/**
 * Why step `step` has nothing to train, or undefined when it has (or when every rollout was dropped
 * for carrying no signal: a normal GRPO step that trains nothing, recorded as such).
 */
function nothingToTrain(
  step: number,
  r: StepBatchResult,
  seqLen: number,
  rolloutErrors: () => string[],
): ApplicationFailure | undefined {
  const a = r.advantages;
  // Rollouts skipped for a prompt longer than seq_len are no failure: generateRollouts has checked
  // that the environments have prompts that fit, so this step drew long ones by chance.
  const errors = a.rollouts > 0 && a.rollouts_errored === a.rollouts ? rolloutErrors() : [];
  if (errors.length > 0 && !errors.every(isPromptTooLong)) {
    return ApplicationFailure.nonRetryable(
      `step ${step} has nothing to train: all ${a.rollouts} rollouts errored (first errors: ${errors.slice(0, 3).join(' | ')})`,
      Failure.NothingToTrain,
    );
  }
  // Cross-entropy tokens (echo's, sft distillation's) train as well as loss-masked ones.
  if (r.counts.samples > 0 && r.counts.lossTokens === 0 && (r.counts.ceTokens ?? 0) === 0) {
    return ApplicationFailure.nonRetryable(
      `step ${step} has nothing to train: its ${r.counts.samples} samples carry no generated token within orchestrator.seq_len (${seqLen}) ` +
        `(${r.counts.truncatedTokens} tokens cut off); raise seq_len (the shared key)`,
      Failure.InvalidConfig,
    );
  }
  return undefined;
}

export function createPackActivities() {
  return {
    async packBatch({ runDir, step }: PackInput): Promise<PackSummary> {
      const layout = new RunLayout(runDir);
      const config = readRunConfig(runDir);
      const o = config.orchestrator;
      const input = stepBatchInput(config, layout, step);
      const result = await inThreadWithHeartbeat<StepBatchResult>(
        libModule('orchestrator/step-batch'),
        'buildStepBatch',
        input,
        { phase: 'starting', step },
      ).catch((e) => {
        // A plugin estimator that fails would fail every retry the same way.
        throw isPluginError(e) ? ApplicationFailure.nonRetryable(e.message, Failure.InvalidConfig) : e;
      });
      const failure = nothingToTrain(step, result, o.seq_len, () =>
        readRollouts(layout.rolloutsDir(step)).flatMap((r) => (r.error ? [r.error] : [])),
      );
      if (failure) throw failure;
      return {
        step,
        path: input.batchFile,
        counts: result.counts,
        advantages: result.advantages,
        ...(result.distill ? { distill: result.distill } : {}),
      };
    },
  };
}
