/**
 * The SFT run as a durable workflow on the same workers as RL, without inference:
 *
 *   prepareSft              (cpu)      configs/sft.json, every step's batch, validation batches
 *   per step k: trainStep   (trainer)  cross-entropy on batches/step_k (restores + replays if behind)
 *               validate    (trainer)  every val.interval steps and at the end
 *               saveCheckpoint         every ckpt.interval steps and at the end
 *               writeWeights           when the validation loss reaches val.target_loss (the end), or
 *                                      an eval needs the step's weights
 *               eval (child)           every eval.interval steps (the base model first, and the end): the
 *                                      environments' evals of the weights, on the run's inference server
 *               recordSftStep (cpu)    the step's metrics line (with the evals of its weights)
 *
 * Every activity is idempotent by (run, step), so a new start on the same run folder (after a
 * crash, or once finished) skips what is done. Signals and the progress query: workflows/plumbing.ts.
 */
import { continueAsNew, executeChild, patched, workflowInfo } from '@temporalio/workflow';
import type { TrainSummary } from '../activities/types';
import type { SFTConfig } from '../lib/config/schemas';
import { serverUrl } from '../lib/config/urls';
import { evalEnvs } from '../lib/eval/envs';
import type { EvalInput, EvalResult } from './eval';
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
  /** Trained steps whose weights the next eval evaluates (eval.interval set; 0: the base model). */
  nextEval?: number;
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
  const { cpu, cpuQuick, cpuWrite, trainer, queues } = runActivities(config.temporal);

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

  // Runs started before SFT had evals have no eval section in their config (and no such commands).
  const interval = config.eval?.interval;
  const evals = interval !== undefined && patched('sft-evals');
  /** The environments' evals of the weights after `step` trained steps (0: the base model), as a child workflow. */
  const evaluate = (step: number, weightDir?: string): Promise<EvalResult> => {
    const e = config.eval;
    const input: EvalInput = {
      temporal: config.temporal,
      plan: {
        runDir,
        envs: evalEnvs(e.env),
        numExamples: e.num_examples,
        rolloutsPerExample: e.rollouts_per_example,
        // `?.`: configs recorded before it existed have none (their evals keep 64 in flight).
        ...(e.concurrency ? { concurrency: e.concurrency } : {}),
        sampling: e.sampling,
        seqLen: config.seq_len,
        seed: config.seed,
        target: {
          kind: 'local',
          baseUrls: [`${serverUrl(config.inference.server)}/v1`],
          modelDir: config.model.name,
          ...(e.renderer ? { renderer: e.renderer } : {}),
          ...(config.inference.server.api_key_var !== undefined
            ? {
                client: {
                  apiKeyVar: config.inference.server.api_key_var,
                  apiKeySetting: 'inference.server.api_key_var',
                },
              }
            : {}),
        },
        versions: [
          step === 0
            ? { name: 'base', step: null, policyVersion: 0 }
            : { name: `step_${step}`, step, policyVersion: step, weightDir },
        ],
      },
    };
    return executeChild<(i: EvalInput) => Promise<EvalResult>>('eval', {
      args: [input],
      workflowId: `${workflowInfo().workflowId}-eval-${step}`,
      taskQueue: queues.cpu,
    });
  };
  if (evals) {
    state.nextEval ??= Math.ceil(state.trained / interval) * interval;
    if (state.nextEval === 0) {
      await evaluate(0);
      state.nextEval = interval;
    }
  }

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
    let evaluated: EvalResult | undefined;
    let evalWeights: string | undefined;
    if (evals && (done >= state.nextEval! || last)) {
      evalWeights = train.weightsDir ?? (await trainer.writeWeights({ runDir, step: done })).path;
      evaluated = await evaluate(done, evalWeights);
      state.nextEval = (Math.floor(done / interval) + 1) * interval;
    }
    await cpuWrite.recordSftStep({
      runDir,
      step,
      train,
      valLoss,
      time,
      ...(evaluated ? { evals: evaluated.results } : {}),
    });
    state.trained = done;
    state.lastTrain = train;
    state.weightsDir =
      train.weightsDir ??
      evalWeights ??
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
