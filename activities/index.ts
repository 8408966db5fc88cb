/**
 * The activities of each worker pool, built around what the pool's process shares between calls
 * (the env worker pool on cpu workers, the in-memory trainer on the trainer worker).
 */
import type { EnvPool } from '../lib/envs/pool';
import { createEvalActivities } from './evaluate';
import { createPackActivities } from './pack';
import { createRolloutActivities } from './rollouts';
import { prepareRun, recordStep, rewindRun } from './run';
import { prepareSft, recordSftStep } from './sft';
import { createTrainerActivities } from './train';

export function createCpuActivities(deps: { pool: EnvPool }) {
  return { ...createRolloutActivities(deps), ...createPackActivities(), ...createEvalActivities(deps), prepareRun, recordStep, rewindRun, prepareSft, recordSftStep };
}

export { createTrainerActivities };
