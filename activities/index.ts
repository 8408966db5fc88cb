/**
 * The activities of each worker pool, built around what the pool's process shares between calls
 * (the env worker pool on cpu workers, the in-memory trainer on the trainer worker).
 */
import type { EnvPool } from '../lib/envs/pool';
import type { GroupLeader } from '../lib/trainer/group';
import { createEvalActivities } from './evaluate';
import { createInFlightActivities } from './inflight-rollouts';
import { withFailureTypes } from './failures';
import { createPackActivities } from './pack';
import { createRolloutActivities } from './generate-rollouts';
import { prepareRun, recordStep, rewindRun } from './run';
import { prepareSft, recordSftStep } from './sft';
import { createTrainerActivities as trainerActivities } from './train';
import { followWandb } from './wandb';

export function createCpuActivities(deps: { pool: EnvPool }) {
  return withFailureTypes({
    ...createRolloutActivities(deps),
    ...createInFlightActivities(deps),
    ...createPackActivities(),
    ...createEvalActivities(deps),
    prepareRun,
    recordStep,
    rewindRun,
    prepareSft,
    recordSftStep,
    followWandb,
  });
}

/** `leader`: this worker is rank 0 of a data-parallel trainer (lib/trainer/group.ts). */
export function createTrainerActivities(deps: { leader?: GroupLeader } = {}) {
  return withFailureTypes(trainerActivities(deps));
}

/** Each pool's activities by type, as the workflows' proxies name them (`import type`). */
export type CpuActivities = ReturnType<typeof createCpuActivities>;
export type TrainerActivities = ReturnType<typeof createTrainerActivities>;
