/**
 * Run bookkeeping on the cpu queue: `prepareRun` checks a run's inputs and lays out its folder;
 * `recordStep` appends a finished step's metrics line (once, whatever the retries).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { Failure } from '../lib/failures';
import { writeFileAtomic } from '../lib/atomic';
import { rlSchema, type RLConfig } from '../lib/config/schemas';
import { checkConfig, holdsRunConfig, readRunConfig, storedConfigText } from '../lib/runfolder/config';
import { rewindRun as rewind } from '../lib/run-ops/rewind';
import { firstNeededVersion, prunePolicyWeights } from '../lib/run-ops/prune';
import { advantageEstimator, rolloutFilters } from '../lib/orchestrator/plugins';
import { resolveModelDir } from '../lib/hub';
import { Tokenizer } from '../lib/model/tokenizer';
import { readHfConfig } from '../lib/model/hf';
import { routerReplayRefusal } from '../lib/trainer/spec';
import { sameTokenizerFiles, TeacherClient, tokenizerMismatch, type TeacherServer } from '../lib/orchestrator/teacher';
import { RunLayout } from '../lib/runfolder/layout';
import { appendStepMetrics, withDocumentedNames } from '../lib/runfolder/metrics';
import { checkEnvironments, checkModel } from '../lib/preflight';
import type { InFlightClaim } from '../lib/runfolder/rollouts';
import type { StepRecordInput, StepTimes } from './types';

/** Checks the model, environments and algorithm plugins, writes configs/rl.json; a rerun with the same config is a no-op. */
export async function prepareRun(config: RLConfig): Promise<{ runDir: string }> {
  checkConfig(config, rlSchema);
  const layout = RunLayout.of(config.output_dir, config.run_name);
  const model = checkModel(config.model.name ?? config.trainer.model.name);
  const refusal = config.trainer.moe.router_replay ? routerReplayRefusal(readHfConfig(model).config) : undefined;
  if (refusal) throw ApplicationFailure.nonRetryable(refusal, Failure.InvalidConfig);
  if (config.env.length === 0)
    throw ApplicationFailure.nonRetryable('no environments configured: add an [[env]] table', Failure.InvalidConfig);
  checkEnvironments([...config.env, ...config.eval.env]);
  const student = config.model.name ?? config.trainer.model.name;
  if (config.distill.teacher) checkTeacher(student, config.distill.teacher, 'distill.teacher');
  config.env.forEach((e, i) => {
    if (e.distill && e.distill.teacher) checkTeacher(student, e.distill.teacher, `env[${i}].distill.teacher`);
  });
  try {
    // Plugins (advantage estimators, rollout filters) load now, so a bad import_path fails the start.
    for (const a of [config.orchestrator.advantage, ...config.env.map((e) => e.advantage)])
      if (a && a.type !== 'rae') advantageEstimator(a);
    rolloutFilters(config.orchestrator);
  } catch (err) {
    throw ApplicationFailure.nonRetryable((err as Error).message, Failure.InvalidConfig);
  }
  const text = storedConfigText(config);
  if (!holdsRunConfig(layout, 'rl', text)) {
    fs.mkdirSync(path.dirname(layout.configFile), { recursive: true });
    writeFileAtomic(layout.configFile, text);
  }
  return { runDir: layout.dir };
}

/**
 * Distillation needs the teacher's token ids to mean the student's: its tokenizer must be the same;
 * and the client must be able to call its server (an API key variable that is set).
 */
function checkTeacher(student: string, teacher: TeacherServer & { model: string }, key: string): void {
  checkModel(teacher.model, `${key}.model`, { weights: false });
  try {
    new TeacherClient(teacher);
  } catch (err) {
    throw ApplicationFailure.nonRetryable((err as Error).message, Failure.InvalidConfig);
  }
  const [studentDir, teacherDir] = [resolveModelDir(student), resolveModelDir(teacher.model, `${key}.model`)];
  const mismatch = sameTokenizerFiles(studentDir, teacherDir)
    ? undefined
    : tokenizerMismatch(Tokenizer.fromDir(studentDir), Tokenizer.fromDir(teacherDir));
  if (mismatch)
    throw ApplicationFailure.nonRetryable(
      `${key}.model: the teacher's tokenizer is not the student's (${mismatch}); distillation compares (and sft trains on) the same token ids`,
      Failure.InvalidConfig,
    );
}

/**
 * `ckpt.resume_step`: the run (rl or sft) continues from its checkpoint of `step`; what came after
 * is discarded (lib/run-ops/rewind.ts). Called once per new start, before its first step.
 */
export async function rewindRun({
  runDir,
  step,
}: {
  runDir: string;
  step: number;
}): Promise<{ weightsDir: string | null }> {
  return rewind(runDir, step, fs.existsSync(new RunLayout(runDir).sftConfigFile) ? 'sft' : 'rl');
}

/** In-flight mode's per-step metrics: off-policy distance, stale drops, idle time of inference and trainer, the producer's concurrency and the servers' load. */
function inFlightMetrics(f: InFlightClaim, times: StepTimes) {
  return {
    off_policy_mean: f.offPolicyMean,
    off_policy_max: f.offPolicyMax,
    stale_groups_dropped: f.staleGroups,
    stale_rollouts_dropped: f.staleRollouts,
    deferred_groups: f.deferred?.length ?? 0,
    inference_idle_seconds: f.inferenceIdleSeconds,
    inflight_concurrency: f.concurrencyMean ?? null,
    inference_running_sequences: f.serverRunningMean ?? null,
    inference_waiting_sequences: f.serverWaitingMean ?? null,
    trainer_idle_seconds: times.trainer_idle ?? null,
  };
}

/**
 * One metrics.jsonl line per step, flat where a chart needs a series; then the policy folders every
 * server has moved past are removed (lib/run-ops/prune.ts), so `weights/` holds a bounded number.
 */
export async function recordStep({
  runDir,
  step,
  policyVersion,
  rollouts,
  batch,
  train,
  times,
}: StepRecordInput): Promise<void> {
  appendStepMetrics(
    new RunLayout(runDir).metricsFile,
    withDocumentedNames({
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
      // The rollout filters (activities/generate-rollouts.ts) and the advantages' zero drop (packBatch).
      groups_dropped: rollouts.filter.groups_dropped,
      dropped_by: rollouts.filter.dropped_by,
      refill_rounds: rollouts.filter.refill_rounds,
      groups_missing: rollouts.filter.groups_missing,
      groups_too_few_valid: batch.advantages.groups_too_few_valid,
      zero_advantage_tokens: batch.advantages.zero_advantage_tokens,
      ...(batch.distill ? { teacher_kl: batch.distill.teacher_kl } : {}),
      ...(rollouts.inFlight ? inFlightMetrics(rollouts.inFlight, times) : {}),
      ...train.metrics,
      progress: train.progress,
      time: times,
    }),
  );
  const layout = new RunLayout(runDir);
  const config = readRunConfig(runDir);
  const from = firstNeededVersion(layout, policyVersion, config.eval.interval);
  const removed = prunePolicyWeights(layout, from, config.async_level);
  if (removed.length > 0)
    Context.current().log.info(`policy weights no server needs any more removed: versions ${removed.join(', ')}`);
}
