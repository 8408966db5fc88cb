/**
 * The run folder, `<output_dir>/<run_name>/`: everything a run writes, so that any step can be
 * resumed from disk alone. Activities exchange these paths, never the data. Each file's format, its
 * reader and its writer live beside this file, in lib/runfolder/ (the file named on the right):
 *
 *   configs/rl.json            the resolved config the run started with (configs/sft.json for SFT)  config.ts
 *   rollouts/step_N/           rollouts.jsonl + dropped.jsonl + summary.json of step N              rollouts.ts
 *   batches/step_N.safetensors packed trainer input of step N                                       batch.ts, packing.ts
 *   batches/val_N.safetensors  SFT validation batches                                               batch.ts
 *   sft/plan.json              SFT: steps and batches prepared (written last: the data's done-marker) config.ts
 *   sft/val/step_N.json        SFT: validation loss after N train steps
 *   eval/<model>.json          eval results per model version                                       lib/eval/results.ts
 *   weights/step_N/            HF folder of policy version N (written by train step N-1)            lib/model/hf.ts
 *   checkpoints/step_N/        trainer state after N train steps                                    checkpoint.ts
 *   train/step_N.json          summary of train step N (written last: the step's done-marker)
 *   inflight/groups/G.json     in-flight mode: finished group number G (written once, never replaced) inflight-groups.ts
 *   inflight/consumed.json     in-flight mode: how far the claims have looked, and how many groups they left over (advisory)
 *   metrics.jsonl              one line per finished step                                           metrics.ts
 *   logs/                      worker and server logs (local launcher)
 *   launcher.json              the local launcher and its processes (pid + start time), while it runs
 */
import * as path from 'node:path';
import { weightsEntry } from './entries';

export class RunLayout {
  readonly dir: string;

  constructor(dir: string) {
    this.dir = path.resolve(dir);
  }

  static of(outputDir: string, runName: string): RunLayout {
    return new RunLayout(path.join(outputDir, runName));
  }

  get configFile(): string {
    return path.join(this.dir, 'configs', 'rl.json');
  }
  get sftConfigFile(): string {
    return path.join(this.dir, 'configs', 'sft.json');
  }
  get sftPlanFile(): string {
    return path.join(this.dir, 'sft', 'plan.json');
  }
  sftValidationFile(step: number): string {
    return path.join(this.dir, 'sft', 'val', `step_${step}.json`);
  }
  valBatchFile(index: number): string {
    return path.join(this.dir, 'batches', `val_${index}.safetensors`);
  }
  rolloutsDir(step: number): string {
    return path.join(this.dir, 'rollouts', `step_${step}`);
  }
  /** Name of the rollouts (one JSON line each) in a rollouts folder. */
  static readonly ROLLOUTS_FILE = 'rollouts.jsonl';
  rolloutsFile(step: number): string {
    return path.join(this.rolloutsDir(step), RunLayout.ROLLOUTS_FILE);
  }
  /** Name of the summary in a rollouts folder (written last: the folder's done-marker). */
  static readonly ROLLOUTS_SUMMARY = 'summary.json';
  rolloutsSummaryFile(step: number): string {
    return path.join(this.rolloutsDir(step), RunLayout.ROLLOUTS_SUMMARY);
  }
  batchFile(step: number): string {
    return path.join(this.dir, 'batches', `step_${step}.safetensors`);
  }
  get weightsRoot(): string {
    return path.join(this.dir, 'weights');
  }
  /** Weights of policy version `version` (version 0 is the base model, not stored here). */
  weightsDir(version: number): string {
    return path.join(this.dir, weightsEntry(version));
  }
  get checkpointsRoot(): string {
    return path.join(this.dir, 'checkpoints');
  }
  checkpointDir(step: number): string {
    return path.join(this.checkpointsRoot, `step_${step}`);
  }
  trainSummaryFile(step: number): string {
    return path.join(this.dir, 'train', `step_${step}.json`);
  }
  get inflightGroupsDir(): string {
    return path.join(this.dir, 'inflight', 'groups');
  }
  inflightGroupFile(seq: number): string {
    return path.join(this.inflightGroupsDir, `${seq}.json`);
  }
  get inflightConsumedFile(): string {
    return path.join(this.dir, 'inflight', 'consumed.json');
  }
  get metricsFile(): string {
    return path.join(this.dir, 'metrics.jsonl');
  }
  get logsDir(): string {
    return path.join(this.dir, 'logs');
  }
  get launcherFile(): string {
    return path.join(this.dir, 'launcher.json');
  }
}

/** Steps N of the `step_N` entries in a folder, ascending. */
export function listSteps(names: readonly string[]): number[] {
  return names
    .map((n) => /^step_(\d+)$/.exec(n))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => Number(m[1]))
    .sort((a, b) => a - b);
}

/** Numbers G of the in-flight group files (`G.json`) in a folder, ascending. */
export function listGroups(names: readonly string[]): number[] {
  return names
    .map((n) => /^(\d+)\.json$/.exec(n))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => Number(m[1]))
    .sort((a, b) => a - b);
}
