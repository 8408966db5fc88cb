/**
 * What crosses the workflow/activity boundary: inputs and summaries (paths and numbers, never
 * tensors). Workflow code imports only types (these, and the activities' in index.ts), so its
 * bundle holds no activity code.
 */
import type { PackSummary } from './pack';
import type { RolloutSummary } from '../lib/runfolder/rollouts';
import type { TrainMetrics, TrainProgress } from '../lib/trainer/types';

export type { PackSummary, RolloutSummary, TrainMetrics, TrainProgress };

export interface StepRef {
  runDir: string;
  step: number;
}

/** Wall-clock marks of a step as the workflow saw them (unix seconds). */
export interface StepTimes {
  wait_start: number;
  generate_start: number;
  generate_end: number;
  pack_end: number;
  train_start: number;
  train_end: number;
  /** In-flight mode: seconds the trainer waited between the previous train step's end and this one's start. */
  trainer_idle?: number;
}

export interface TrainSummary {
  step: number;
  /** HF weights this step wrote (`weights/step_<step+1>`); null where the run keeps none for it (SFT between checkpoints). */
  weightsDir: string | null;
  metrics: TrainMetrics;
  progress: TrainProgress;
}

export interface StepRecordInput extends StepRef {
  policyVersion: number;
  rollouts: RolloutSummary;
  batch: PackSummary;
  train: TrainSummary;
  times: StepTimes;
}
