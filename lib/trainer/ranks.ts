/**
 * One trainer process's runtime, whatever its rank: the TrainerRuntime of one run at one step,
 * rebuilt from the newest good checkpoint and the stored batches whenever it is not exactly where
 * a call needs it (a new process, a crash, another run, a new process group). The trainer
 * activities (rank 0) and the follower ranks (lib/trainer/group.ts) share it, so every rank makes
 * the same restore decision and replays in lockstep.
 */
import * as path from 'node:path';
import { validationBatchFiles } from '../runfolder/config';
import type { RankGroup, RankJob } from './group';
import { TrainerRuntime, type BatchRepacker, type RestoreReport } from './runtime';
import { readTrainingSpec } from './spec';

export class RankTrainer {
  private runtime?: TrainerRuntime;

  /** `repack`: packs a damaged batch again (lib/orchestrator/repack.ts). */
  constructor(private readonly repack?: BatchRepacker) {}

  /** The process group of the current generation (data parallel), if any. */
  private group?: RankGroup;

  /** A new generation (or none): the runtime is rebuilt at its next use, on that group. */
  setGroup(group: RankGroup | undefined): void {
    this.group = group;
    this.runtime = undefined;
  }

  /** Forgets the runtime (after a failure its state may be half a step). */
  drop(): void {
    this.runtime = undefined;
  }

  /** The runtime of `runDir` at exactly `step` applied steps. */
  async at(
    runDir: string,
    step: number,
    hooks: {
      onReplay?: (done: number, total: number) => void;
      onRestored?: (report: RestoreReport) => void;
    } = {},
  ): Promise<TrainerRuntime> {
    const rt = this.runtime;
    if (rt && rt.runDir === path.resolve(runDir) && rt.progress.steps === step) return rt;
    this.runtime = undefined;
    const restored = await TrainerRuntime.restore(runDir, readTrainingSpec(runDir).trainer, step, {
      onReplay: hooks.onReplay,
      group: this.group,
      repack: this.repack,
    });
    hooks.onRestored?.(restored.report);
    this.runtime = restored.runtime;
    return restored.runtime;
  }

  /**
   * What a follower rank does for a job: the collective part (rank 0 adds the writes). Under full
   * sharding, writing weights and scoring validation batches are collectives too.
   */
  async follow(job: RankJob): Promise<void> {
    const { runDir, step } = job;
    const rt = await this.at(runDir, step);
    if (job.op === 'train') {
      await rt.train(step);
      if (rt.collective && readTrainingSpec(runDir).writesWeights(step + 1)) await rt.shareWeights();
    } else if (job.op === 'checkpoint') await rt.checkpoint();
    else if (job.op === 'weights' && rt.collective) await rt.shareWeights();
    else if (job.op === 'validate' && rt.collective) await rt.validationLoss(validationBatchFiles(runDir));
  }
}
