/**
 * What the `rl`, `sft` and `eval` workflows share: the retry policy, the activity proxies of a run's
 * task queues, and the pause / resume / stop signals with the `progress` query.
 */
import {
  ActivityCancellationType,
  condition,
  defineQuery,
  defineSignal,
  proxyActivities,
  setHandler,
} from '@temporalio/workflow';
import type { CpuActivities, TrainerActivities } from '../activities';
import type { RunTemporalConfig } from '../lib/config/schemas';
import { taskQueues } from '../lib/temporal/queues';

/** Retries go on until the problem is fixed (a worker comes back); non-retryable failures stop them. */
export const retry = { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute' } as const;

type Duration = `${number} ${'seconds' | 'minutes' | 'hours'}`;

/**
 * Activity proxies on the run's queues:
 *   cpu       long cpu work (rollouts, packing, evaluation), heartbeating; `cpuStartToClose` bounds it
 *   cpuQuick  preparation (prepareRun, prepareEval, rewindRun): 2 minutes (prepareSft, which
 *             tokenises the data set and heartbeats, runs on `cpu`)
 *   cpuWrite  writes of milliseconds that send no heartbeat: bounded by the heartbeat timeout, so one
 *             whose worker died is retried as soon as the others, not after minutes of a stalled run
 *   trainer   the trainer queue (one activity at a time), heartbeating, 6 hours
 *   producer  in-flight mode's rollout producer: runs until the workflow cancels it, heartbeating
 *   follower  a follower of the run folder (W&B) for the execution's lifetime, heartbeating; its
 *             cancellation is waited for (it finishes what it follows first)
 */
export function runActivities(
  temporal: Pick<RunTemporalConfig, 'task_queue' | 'heartbeat_timeout_s'>,
  cpuStartToClose: Duration = '2 hours',
) {
  const queues = taskQueues(temporal.task_queue);
  const heartbeatTimeout: Duration = `${temporal.heartbeat_timeout_s} seconds`;
  return {
    queues,
    cpu: proxyActivities<CpuActivities>({
      taskQueue: queues.cpu,
      startToCloseTimeout: cpuStartToClose,
      heartbeatTimeout,
      retry,
    }),
    cpuQuick: proxyActivities<CpuActivities>({ taskQueue: queues.cpu, startToCloseTimeout: '2 minutes', retry }),
    cpuWrite: proxyActivities<CpuActivities>({ taskQueue: queues.cpu, startToCloseTimeout: heartbeatTimeout, retry }),
    producer: proxyActivities<CpuActivities>({
      taskQueue: queues.cpu,
      startToCloseTimeout: '8760 hours',
      heartbeatTimeout,
      retry,
    }),
    follower: proxyActivities<CpuActivities>({
      taskQueue: queues.cpu,
      startToCloseTimeout: '8760 hours',
      heartbeatTimeout,
      retry,
      cancellationType: ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
    }),
    trainer: proxyActivities<TrainerActivities>({
      taskQueue: queues.trainer,
      startToCloseTimeout: '6 hours',
      heartbeatTimeout,
      retry,
    }),
  };
}

/** Pause before the next step (the steps in flight finish). */
export const pauseSignal = defineSignal('pause');
export const resumeSignal = defineSignal('resume');
/** Finish the steps already started, then end the run (it can be resumed later with a new start). */
export const stopSignal = defineSignal('stop');
/** Where a run is: its state (see `RLProgress`, `SftProgress`). */
export const progressQuery = defineQuery<unknown>('progress');

/** The part of a run's state the signals steer. */
export interface Controls {
  paused: boolean;
  stopping: boolean;
}

/**
 * Installs the signal handlers, which steer `controls()` (the run's state, or the flags a run keeps
 * while it is prepared), and the `progress` query answered by `progress()`. Called before the
 * workflow's first await, so that a query or signal sent while the run is prepared is answered.
 */
function handleControls(controls: () => Controls, progress: () => unknown): void {
  setHandler(pauseSignal, () => void (controls().paused = true));
  setHandler(resumeSignal, () => void (controls().paused = false));
  setHandler(stopSignal, () => void (controls().stopping = true));
  setHandler(progressQuery, progress);
}

/** What `progress` answers while a run is prepared (its folder, its data): nothing trained yet. */
export interface Preparing extends Controls {
  preparing: true;
  trained: 0;
  maxSteps?: number;
}

/**
 * The controls of a run that is prepared before its first step, or resumed with its state
 * (`resumeFrom`): signals and the `progress` query are answered from the start. A pause or stop sent
 * while the run is prepared is kept in `early` (spread it into the new state), `progress` says
 * `preparing` (with `maxSteps` when known) until `prepared(state)`, then `progress(state)`.
 */
export function controlsFromStart<S extends Controls>(
  resumeFrom: S | undefined,
  progress: (state: S) => unknown,
  maxSteps?: number,
): { early: Controls; prepared(state: S): void } {
  const early: Controls = { paused: false, stopping: false };
  let state = resumeFrom;
  handleControls(
    () => state ?? early,
    () => (state ? progress(state) : ({ preparing: true, trained: 0, ...early, maxSteps } satisfies Preparing)),
  );
  return { early, prepared: (s) => void (state = s) };
}

/** Waits while the run is paused; true when it should stop instead of starting another step. */
export async function stopBeforeNextStep(state: Controls): Promise<boolean> {
  await condition(() => !state.paused || state.stopping);
  return state.stopping;
}
