/**
 * Trainer activities (trainer queue, one at a time per worker): `trainStep`, `saveCheckpoint` and
 * (SFT) `validate` and `writeWeights`.
 * The worker keeps one TrainerRuntime in memory; when it is not exactly where a call needs it (a
 * new process, a crash, another run) it is rebuilt from the newest good checkpoint and the stored
 * batches. All are idempotent by (run, step): finished work is found on disk (validate only reads).
 * Data parallel (`trainer.world_size` > 1), this worker is rank 0: each activity is a job that
 * every rank runs (lib/trainer/group.ts), and only this rank writes.
 */
import * as fs from 'node:fs';
import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { Failure } from '../lib/failures';
import { withHeartbeat } from '../lib/temporal/heartbeat';
import { storedJson } from '../lib/atomic';
import { repackStepBatch } from '../lib/orchestrator/repack';
import { readRunConfig, validationBatchFiles } from '../lib/runfolder/config';
import type { RLConfig } from '../lib/config/schemas';
import { InferenceClient } from '../lib/orchestrator/client';
import { rlClientOptions } from '../lib/orchestrator/client-options';
import { WeightBroadcaster, type BroadcastServers, type BroadcastVersion } from '../lib/trainer/broadcast';
import * as native from '../native';
import { RunLayout } from '../lib/runfolder/layout';
import { pruneRunFolder } from '../lib/run-ops/prune';
import type { GroupLeader, RankJob } from '../lib/trainer/group';
import { RankTrainer } from '../lib/trainer/ranks';
import { readTrainingSpec } from '../lib/trainer/spec';
import { NonFiniteWeightsError, TrainerRuntime } from '../lib/trainer/runtime';
import type { StepRef, TrainMetrics, TrainSummary } from './types';

interface ValidationResult {
  step: number;
  loss: number;
  tokens: number;
}

/**
 * `rt.writeWeights(version)`; weights with a NaN or Inf fail the step for good, naming the tensor:
 * a retry would train the same batch into the same weights.
 */
async function publishWeights(
  rt: TrainerRuntime,
  version: number,
  metrics?: TrainMetrics,
  broadcast?: BroadcastVersion,
): Promise<string> {
  try {
    return await rt.writeWeights(version, broadcast && ((u, tensors) => broadcast.unit(u, tensors)));
  } catch (e) {
    if (!(e instanceof NonFiniteWeightsError)) throw e;
    const stats = metrics
      ? ` (step ${version - 1}: loss ${metrics.loss}, grad_norm ${metrics.grad_norm}, lr ${metrics.lr})`
      : '';
    throw ApplicationFailure.nonRetryable(
      `the run diverged${stats}: ${e.message}; lower trainer.optim.lr (or trainer.optim.max_norm) and start again`,
      Failure.NonFiniteWeights,
    );
  }
}

/** weight_broadcast nccl: the run's servers, called as its orchestrator calls them (with their key). */
function broadcastTo(config: RLConfig): BroadcastServers {
  const client = new InferenceClient(config.orchestrator.base_urls, rlClientOptions(config));
  return { names: client.urls, post: (i, route, body) => client.control(i, route, body) };
}

/** `leader`: this worker is rank 0 of a data-parallel trainer. */
export function createTrainerActivities(opts: { leader?: GroupLeader } = {}) {
  const { leader } = opts;
  const ranks = new RankTrainer(repackStepBatch);
  let phase = 'idle';
  // Its store and group outlive the activity: one per worker process.
  let broadcaster: WeightBroadcaster | undefined;

  /** The broadcast of `version` when the run asks for one (rl, weight_broadcast nccl), else undefined. */
  async function beginBroadcast(rt: TrainerRuntime, runDir: string, version: number) {
    if (!fs.existsSync(new RunLayout(runDir).configFile)) return undefined; // sft
    const config = readRunConfig(runDir);
    const b = config.weight_broadcast;
    if (b.type !== 'nccl') return undefined;
    const device = config.trainer.model.device !== 'cpu' && native.info().nccl ? config.trainer.model.device : 'cpu';
    broadcaster ??= new WeightBroadcaster(
      { host: b.host, port: b.port, timeoutS: b.timeout_s, bucketBytes: Math.round(b.bucket_mb * 2 ** 20), device },
      { info: (line) => Context.current().log.info(line), warn: (line) => Context.current().log.warn(line) },
    );
    return broadcaster.begin(version, new RunLayout(runDir).weightsDir(version), rt.policyUnits(), broadcastTo(config));
  }

  /**
   * `work` on the runtime at exactly `job.step` (restored first if need be). Data parallel, every
   * rank gets the job first; any failure ends the process group, so the retry starts all ranks
   * afresh from the newest checkpoint.
   */
  async function onJob<T>(job: RankJob, work: (rt: TrainerRuntime) => Promise<T>): Promise<T> {
    const { runDir, step } = job;
    try {
      if (leader) {
        phase = 'forming the trainer process group';
        const { group, fresh } = await leader.ensure();
        if (fresh) ranks.setGroup(group);
        await leader.dispatch(job);
      }
      phase = 'restoring';
      const rt = await ranks.at(runDir, step, {
        onReplay: (done, total) => (phase = `replaying ${done}/${total}`),
        onRestored: (report) => {
          Context.current().log.info('trainer restored', {
            runDir,
            step,
            from: report.from,
            replayed: report.replayed,
            skipped: report.skipped,
          });
          for (const s of report.skipped) Context.current().log.warn(`unusable checkpoint skipped: ${s}`);
          for (const b of report.rebuilt) Context.current().log.warn(`damaged batch: ${b}`);
        },
      });
      return await work(rt);
    } catch (e) {
      if (!leader) throw e;
      ranks.drop();
      const reports = await leader.invalidate();
      if (reports.length > 0 && e instanceof Error) e.message += ` (other ranks: ${reports.join('; ')})`;
      throw e;
    }
  }

  /** `work` on the runtime at exactly `step`, heartbeating meanwhile with `label` as its phase. */
  function onRuntimeAt<T>(job: RankJob, label: string, work: (rt: TrainerRuntime) => Promise<T>): Promise<T> {
    return withHeartbeat(
      () => ({ step: job.step, phase }),
      () =>
        onJob(job, async (rt) => {
          phase = label;
          const result = await work(rt);
          phase = 'idle';
          return result;
        }),
    );
  }

  return {
    async trainStep({ runDir, step }: StepRef): Promise<TrainSummary> {
      const summaryFile = new RunLayout(runDir).trainSummaryFile(step);
      return storedJson(summaryFile, () =>
        withHeartbeat(
          () => ({ step, phase }),
          async () => {
            const restoreStart = performance.now();
            let replay = 0;
            // The weights are written in the job: under full sharding every rank gathers them.
            const { rt, metrics, weightsDir, save } = await onJob({ op: 'train', runDir, step }, async (rt) => {
              replay = (performance.now() - restoreStart) / 1000;
              phase = 'training';
              const seen = rt.rebuilt.length;
              const metrics = await rt.train(step);
              for (const b of rt.rebuilt.slice(seen)) Context.current().log.warn(`damaged batch: ${b}`);
              const saveStart = performance.now();
              let weightsDir: string | null = null;
              if (readTrainingSpec(runDir).writesWeights(step + 1)) {
                phase = 'saving weights';
                // Sent to the servers unit by unit as it is written (weight_broadcast nccl).
                const broadcast = await beginBroadcast(rt, runDir, step + 1);
                weightsDir = await publishWeights(rt, step + 1, metrics, broadcast);
                const report = await broadcast?.end();
                if (report) {
                  metrics.weight_broadcast_servers = report.received.length;
                  metrics.weight_broadcast_missed = report.missed.length;
                  Context.current().log.info(
                    `version ${report.version} broadcast to ${report.received.length} server(s) in ${report.seconds.toFixed(2)} s (${report.bytes} bytes)${report.missed.length > 0 ? `; missed, they read the folder: ${report.missed.join('; ')}` : ''}`,
                  );
                }
              }
              return { rt, metrics, weightsDir, save: (performance.now() - saveStart) / 1000 };
            });
            metrics.seconds.replay = replay;
            metrics.seconds.save = save;
            phase = 'idle';
            const summary: TrainSummary = { step, weightsDir, metrics, progress: { ...rt.progress } };
            return summary;
          },
        ),
      );
    },

    /**
     * SFT validation: the cross-entropy of the model after `step` train steps on the run's
     * validation batches. Stored, so a second start of a finished run need not rebuild the model
     * at every validated step.
     */
    async validate({ runDir, step }: StepRef): Promise<ValidationResult> {
      const files = validationBatchFiles(runDir);
      if (files.length === 0)
        throw ApplicationFailure.nonRetryable(`run ${runDir} has no validation batches`, Failure.NoValidationData);
      return storedJson(new RunLayout(runDir).sftValidationFile(step), () =>
        onRuntimeAt({ op: 'validate', runDir, step }, 'validating', async (rt): Promise<ValidationResult> => ({
          step,
          ...(await rt.validationLoss(files)),
        })),
      );
    },

    /**
     * HF weights after `step` train steps, for an SFT run that reaches `val.target_loss` at a step
     * whose weights `trainStep` did not write (it writes them every `ckpt.interval` steps).
     */
    async writeWeights({ runDir, step }: StepRef): Promise<{ path: string }> {
      const dir = new RunLayout(runDir).weightsDir(step);
      if (!fs.existsSync(dir))
        await onRuntimeAt({ op: 'weights', runDir, step }, 'saving weights', (rt) => publishWeights(rt, step));
      return { path: dir };
    },

    /** Checkpoint after `step` train steps; prunes what `ckpt.keep_last` no longer needs. */
    async saveCheckpoint({ runDir, step }: StepRef): Promise<{ path: string }> {
      const layout = new RunLayout(runDir);
      const dir = layout.checkpointDir(step);
      if (!fs.existsSync(dir))
        await onRuntimeAt({ op: 'checkpoint', runDir, step }, 'checkpointing', (rt) => rt.checkpoint());
      const spec = readTrainingSpec(runDir);
      pruneRunFolder(layout, spec.keepLast, spec.asyncLevel);
      return { path: dir };
    },
  };
}
