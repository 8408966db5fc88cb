/**
 * The SFT run as a durable workflow on the same workers as RL, without inference:
 *
 *   prepareSft              (cpu)      configs/sft.json, every step's batch, validation batches
 *   per step k: trainStep   (trainer)  cross-entropy on batches/step_k (restores + replays if behind)
 *               validate    (trainer)  every val.interval steps and at the end
 *               saveCheckpoint         every ckpt.interval steps and at the end
 *               writeWeights           when the validation loss reaches val.target_loss (the end)
 *               recordSftStep (cpu)    the step's metrics line
 *
 * Every activity is idempotent by (run, step), so a new start on the same run folder (after a
 * crash, or once finished) skips what is done. Signals and the progress query: workflows/plumbing.ts.
 */
import { continueAsNew, workflowInfo } from '@temporalio/workflow';
import type { TrainSummary } from '../activities/types';
import type { SFTConfig } from '../lib/config/schemas';
import { controlsFromStart, runActivities, stopBeforeNextStep, type Preparing } from './plumbing';

export interface SftState {
  runDir: string;
  /** Steps of the run (from its plan). */
  steps: number;
  /** Train steps finished. */
  trained: number;
  paused: boolean;
  stopping: boolean;
  lastTrain?: TrainSummary;
  lastValLoss?: number;
  /** The validation loss reached val.target_loss: the run ends at this step. */
  reachedTarget: boolean;
  /** HF weights of the newest step that wrote them (carried across continue-as-new). */
  weightsDir?: string;
}

export type SftProgress = (SftState & { maxSteps: number }) | Preparing;

export interface SftResult {
  runDir: string;
  steps: number;
  /** Stopped by a signal before its last step. */
  stoppedEarly: boolean;
  /** Ended before its last step because the validation loss reached val.target_loss. */
  reachedTarget: boolean;
  lastTrain?: TrainSummary;
  lastValLoss?: number;
  /** HF weights of the last step trained. */
  weightsDir?: string;
}

/** How the workflow runs, apart from what it trains. */
export interface SftOptions {
  /** Steps one workflow execution trains before it continues as new (bounds its history); default 200. */
  stepsPerRun?: number;
}

const STEPS_PER_RUN = 200;

export async function sft(config: SFTConfig, resumeFrom?: SftState, opts: SftOptions = {}): Promise<SftResult> {
  const stepsPerRun = opts.stepsPerRun ?? STEPS_PER_RUN;
  const { cpu, cpuQuick, cpuWrite, trainer } = runActivities(config.temporal);

  const controls = controlsFromStart(resumeFrom, (s): SftProgress => ({ ...s, maxSteps: s.steps }));
  let state: SftState;
  if (resumeFrom) state = resumeFrom;
  else {
    const plan = await cpu.prepareSft(config);
    state = {
      runDir: plan.runDir,
      steps: plan.steps,
      trained: 0,
      reachedTarget: false,
      ...controls.early,
    };
    const from = config.ckpt.resume_step;
    if (from !== undefined) {
      // Continue from that checkpoint (activities/run.ts rewindRun); the batches stay, prepared once.
      const { weightsDir } = await cpuQuick.rewindRun({ runDir: plan.runDir, step: from });
      state.trained = from;
      if (weightsDir !== null) state.weightsDir = weightsDir;
    }
  }
  controls.prepared(state);
  const { runDir, steps } = state;

  const startedThisRun = state.trained;
  const target = config.val.target_loss;
  while (state.trained < steps && !state.stopping && !state.reachedTarget) {
    if (await stopBeforeNextStep(state)) break;
    const step = state.trained;
    const trainStart = Date.now() / 1000;
    const train = await trainer.trainStep({ runDir, step });
    const time = { train_start: trainStart, train_end: Date.now() / 1000 };
    const done = step + 1;
    let valLoss: number | undefined;
    if (config.val.interval !== undefined && (done % config.val.interval === 0 || done === steps)) {
      valLoss = (await trainer.validate({ runDir, step: done })).loss;
      state.lastValLoss = valLoss;
      state.reachedTarget = target !== undefined && valLoss <= target;
    }
    const last = done === steps || state.reachedTarget;
    if (done % config.ckpt.interval === 0 || last) await trainer.saveCheckpoint({ runDir, step: done });
    await cpuWrite.recordSftStep({ runDir, step, train, valLoss, time });
    state.trained = done;
    state.lastTrain = train;
    state.weightsDir =
      train.weightsDir ??
      (state.reachedTarget ? (await trainer.writeWeights({ runDir, step: done })).path : state.weightsDir);
    if (!last && (workflowInfo().continueAsNewSuggested || state.trained - startedThisRun >= stepsPerRun)) {
      await continueAsNew<typeof sft>(config, state, opts);
    }
  }
  const { reachedTarget } = state;
  return {
    runDir,
    steps: state.trained,
    stoppedEarly: state.trained < steps && !reachedTarget,
    reachedTarget,
    lastTrain: state.lastTrain,
    lastValLoss: state.lastValLoss,
    weightsDir: state.weightsDir,
  };
}
