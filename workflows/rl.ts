/**
 * The RL run as a durable workflow. Per step n, with async_level = k:
 *
 *   1. wait until the trainer has finished step n-k-1, so policy version n-k exists;
 *   2. generateRollouts(n, version n-k)     (cpu)   rollouts + rewards -> rollouts/step_n/
 *   3. packBatch(n)                         (cpu)   advantages, packing -> batches/step_n
 *   4. trainStep(n)                         (trainer, not awaited: step n+1 generates meanwhile;
 *                                            train steps run strictly in order) -> weights/step_n+1
 *   5. every ckpt.interval trained steps: saveCheckpoint; then the step's metrics line (recordStep,
 *      beside the next train step: lines in step order, the trainer never waiting for them).
 *   6. every eval.interval policy versions (from the base model on) and at the end: an `eval` child
 *      workflow into the run's eval/ folder, run between steps so nothing else drives inference.
 *
 * In-flight mode (orchestrator.in_flight.enabled): a `produceRollouts` activity generates for the
 * whole execution (cancelled before it ends or continues as new), on the newest policy; step n's
 * rollouts are `claimRollouts(n)`, the next finished groups, instead of 1-2. See README, "In-flight mode".
 *
 * Everything large stays in the run folder; activities exchange paths and summaries. The history is
 * bounded by continue-as-new, which carries the run state. Signals pause, resume and stop the run
 * after the current step; the `progress` query reports where it is (workflows/plumbing.ts).
 */
import {
  ApplicationFailure,
  CancellationScope,
  condition,
  continueAsNew,
  executeChild,
  isCancellation,
  patched,
  workflowInfo,
} from '@temporalio/workflow';
import type { RolloutSummary, StepTimes, TrainSummary } from '../activities/types';
import type { RLConfig } from '../lib/config/schemas';
import { rlClientOptions } from '../lib/orchestrator/client-options';
import { inRun, weightsEntry } from '../lib/run/entries';
import type { EvalInput, EvalResult } from './eval';
import { controlsFromStart, runActivities, stopBeforeNextStep, type Preparing } from './plumbing';

export interface RLState {
  runDir: string;
  /** Next step to generate. */
  step: number;
  /** Train steps finished: the newest policy version. */
  trained: number;
  paused: boolean;
  stopping: boolean;
  lastTrain?: TrainSummary;
  lastReward?: number;
  /** Next policy version to evaluate (eval.interval set). */
  nextEval?: number;
}

export type RLProgress = (RLState & { maxSteps?: number }) | Preparing;

export interface RLResult {
  runDir: string;
  steps: number;
  stoppedEarly: boolean;
  lastTrain?: TrainSummary;
  lastReward?: number;
}

/** How the workflow runs, apart from what it trains. */
export interface RLOptions {
  /** Steps one workflow execution generates before it continues as new (bounds its history); default 100. */
  stepsPerRun?: number;
}

const STEPS_PER_RUN = 100;

export async function rl(config: RLConfig, resumeFrom?: RLState, opts: RLOptions = {}): Promise<RLResult> {
  const stepsPerRun = opts.stepsPerRun ?? STEPS_PER_RUN;
  const { queues, cpu, cpuQuick, cpuWrite, trainer, producer } = runActivities(config.temporal);
  // Read with `?.`: configs recorded before in-flight mode existed have no such section.
  const inFlight = config.orchestrator.in_flight?.enabled === true;

  /** A new start: the run folder, rewound to ckpt.resume_step when it is set (else every step is walked, done ones found on disk). */
  async function start(): Promise<RLState> {
    const { runDir } = await cpuQuick.prepareRun(config);
    const from = config.ckpt.resume_step ?? 0;
    if (config.ckpt.resume_step !== undefined) await cpuQuick.rewindRun({ runDir, step: from });
    const interval = config.eval.interval;
    // Evals of versions up to the resume step are kept; the next due one is the first at or after it.
    const nextEval = interval === undefined ? undefined : Math.ceil(from / interval) * interval;
    return { runDir, step: from, trained: from, paused: false, stopping: false, nextEval };
  }

  const maxSteps = config.max_steps ?? Infinity;
  const k = config.async_level;
  const controls = controlsFromStart(
    resumeFrom,
    (s): RLProgress => ({ ...s, maxSteps: config.max_steps }),
    config.max_steps,
  );
  const state: RLState = resumeFrom ?? { ...(await start()), ...controls.early };
  controls.prepared(state);
  const { runDir } = state;

  /** Evaluates policy `version` on the eval envs (the training envs if none) with an `eval` child workflow. */
  const evaluate = (version: number) => {
    const e = config.eval;
    const input: EvalInput = {
      temporal: config.temporal,
      plan: {
        runDir,
        envs: (e.env.length > 0 ? e.env : config.env).map(({ id, args }) => ({ id, args })),
        numExamples: e.num_examples,
        rolloutsPerExample: e.rollouts_per_example,
        sampling: e.sampling,
        seqLen: config.orchestrator.seq_len,
        seed: config.seed,
        target: {
          kind: 'local',
          baseUrls: config.orchestrator.base_urls,
          modelDir: config.orchestrator.model.name,
          client: rlClientOptions(config),
        },
        versions: [
          version === 0
            ? { name: 'base', step: null, policyVersion: 0 }
            : {
                name: `step_${version}`,
                step: version,
                policyVersion: version,
                weightDir: inRun(runDir, weightsEntry(version)),
              },
        ],
      },
    };
    return executeChild<(i: EvalInput) => Promise<EvalResult>>('eval', {
      args: [input],
      workflowId: `${workflowInfo().workflowId}-eval-${version}`,
      taskQueue: queues.cpu,
    });
  };
  const interval = config.eval.interval;
  if (interval !== undefined) state.nextEval ??= 0;
  /** Evals of the versions due by now (or by the end), before the next rollouts use the server. */
  const runDueEvals = async (final: boolean) => {
    while (interval !== undefined && state.nextEval! <= state.trained) {
      await evaluate(state.nextEval!);
      state.nextEval = state.nextEval! + interval;
    }
    if (final && interval !== undefined && state.nextEval! - interval < state.trained) {
      await evaluate(state.trained);
      state.nextEval = state.trained + interval;
    }
  };

  let training: Promise<void> = Promise.resolve();
  let recording: Promise<void> = Promise.resolve();
  // Executions started before metrics lines were written beside training write them in the
  // trainer's chain, as their histories say.
  const recordBesideTraining = patched('record-beside-training');
  let failure: unknown;
  const startedThisRun = state.step;

  // In-flight mode: the producer runs while this execution does; its failure (one retrying cannot
  // fix) fails the run, also while a claim waits for rollouts it would never write.
  const producing = inFlight ? new CancellationScope() : undefined;
  let producerFailed: Promise<never> = new Promise(() => {});
  if (producing) {
    producerFailed = producing
      .run(() => producer.produceRollouts({ runDir }))
      .then(
        () => new Promise<never>(() => {}),
        (e) => {
          if (isCancellation(e)) return new Promise<never>(() => {});
          failure ??= e;
          throw e;
        },
      );
    producerFailed.catch(() => {});
  }
  let lastTrainEnd: number | undefined;

  while (state.step < maxSteps && !state.stopping) {
    if (await stopBeforeNextStep(state)) break;
    const step = state.step;
    const waitStart = Date.now();
    // async_level: rollouts of step n use policy version n - k: never older (the bound), and not
    // "whatever is newest" either, so a run is reproducible whatever the timing of its workers.
    const policyVersion = Math.max(0, step - k);
    await condition(() => state.trained >= policyVersion || failure !== undefined);
    if (failure !== undefined) throw failure;
    let rollouts: RolloutSummary;
    const times: StepTimes = { wait_start: waitStart / 1000 } as StepTimes;
    if (inFlight) {
      // The step takes the next finished groups once the trainer is within async_level steps of it.
      times.generate_start = Date.now() / 1000;
      rollouts = await Promise.race([cpu.claimRollouts({ runDir, step }), producerFailed]);
    } else {
      await runDueEvals(false);
      times.generate_start = Date.now() / 1000;
      rollouts = await cpu.generateRollouts({ runDir, step, policyVersion });
    }
    times.generate_end = Date.now() / 1000;
    const batch = await cpu.packBatch({ runDir, step });
    times.pack_end = Date.now() / 1000;
    state.lastReward = rollouts.rewardMean;
    state.step = step + 1;

    training = training.then(async () => {
      times.train_start = Date.now() / 1000;
      const train = await trainer.trainStep({ runDir, step });
      times.train_end = Date.now() / 1000;
      if (inFlight) {
        if (lastTrainEnd !== undefined) times.trainer_idle = times.train_start - lastTrainEnd;
        lastTrainEnd = times.train_end;
      }
      state.trained = step + 1;
      state.lastTrain = train;
      if (state.trained % config.ckpt.interval === 0 || state.trained === maxSteps) {
        await trainer.saveCheckpoint({ runDir, step: state.trained });
      }
      // In-flight mode: the oldest version the step's tokens were sampled with.
      const version = inFlight ? rollouts.policyVersion : policyVersion;
      const record = () => cpuWrite.recordStep({ runDir, step, policyVersion: version, rollouts, batch, train, times });
      if (!recordBesideTraining) return record();
      // The metrics line is written while the next step trains, never before it: the trainer does
      // not wait for it. Lines are still written in step order.
      recording = recording.then(record);
      recording.catch((e) => (failure ??= e));
    });
    training.catch((e) => (failure ??= e));

    if (workflowInfo().continueAsNewSuggested || state.step - startedThisRun >= stepsPerRun) {
      await training;
      await recording;
      producing?.cancel();
      await continueAsNew<typeof rl>(config, state, opts);
    }
  }
  await training;
  await recording;
  producing?.cancel();
  if (failure !== undefined)
    throw failure instanceof Error ? failure : ApplicationFailure.create({ message: String(failure) });
  await runDueEvals(true);
  return {
    runDir,
    steps: state.trained,
    stoppedEarly: state.trained < maxSteps,
    lastTrain: state.lastTrain,
    lastReward: state.lastReward,
  };
}
