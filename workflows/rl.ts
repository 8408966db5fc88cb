/**
 * The RL run as a durable workflow. Per step n, with async_level = k:
 *
 *   1. once the trainer has finished step n-k-1 (policy version n-k exists):
 *      generateRollouts(n, version n-k)    (cpu)      rollouts + rewards -> rollouts/step_n/
 *   2. packBatch(n)                         (cpu)      advantages, packing -> batches/step_n
 *   3. trainStep(n) once the trainer is free (trainer: step n+1 generates meanwhile; train steps
 *      run strictly in order)                          -> weights/step_n+1
 *   4. every ckpt.interval trained steps: saveCheckpoint; then the step's metrics line (recordStep,
 *      beside the next train step: lines in step order, the trainer never waiting for them).
 *   5. every eval.interval policy versions (from the base model on) and at the end: an `eval` child
 *      workflow into the run's eval/ folder, run between steps when nothing else is in flight.
 *
 * In-flight mode (orchestrator.in_flight.enabled): a `produceRollouts` activity generates for the
 * whole execution (cancelled before it ends or continues as new), on the newest policy; step n's
 * rollouts are `claimRollouts(n)`, the next finished groups, instead of 1. See docs/workflow.md, "In-flight mode".
 *
 * The steps overlap, yet every command is issued from one loop that takes one completion at a
 * time in the order Temporal resolved them (workflows/inbox.ts), so a replay meets the commands in
 * the order the history recorded them however the completions were grouped.
 *
 * Everything large stays in the run folder; activities exchange paths and summaries. The history is
 * bounded by continue-as-new, which carries the run state. Signals pause, resume and stop the run
 * after the current step; the `progress` query reports where it is (workflows/plumbing.ts).
 */
import {
  CancellationScope,
  condition,
  continueAsNew,
  deprecatePatch,
  executeChild,
  isCancellation,
  patched,
  workflowInfo,
} from '@temporalio/workflow';
import type { PackSummary, RolloutSummary, StepTimes, TrainSummary } from '../activities/types';
import type { RLConfig } from '../lib/config/schemas';
import { evalEnvs } from '../lib/eval/envs';
import { rlClientOptions } from '../lib/orchestrator/client-options';
import { inRun, weightsEntry } from '../lib/runfolder/entries';
import type { EvalInput, EvalResult } from './eval';
import { Inbox } from './inbox';
import { controlsFromStart, runActivities, type Preparing } from './plumbing';

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
  const activities = runActivities(config.temporal);
  const { queues, cpuQuick } = activities;

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
        envs: evalEnvs(e.env.length > 0 ? e.env : config.env),
        numExamples: e.num_examples,
        rolloutsPerExample: e.rollouts_per_example,
        // `?.`: configs recorded before it existed have none (their evals keep 64 in flight).
        ...(e.concurrency ? { concurrency: e.concurrency } : {}),
        sampling: e.sampling,
        seqLen: config.orchestrator.seq_len,
        seed: config.seed,
        target: {
          kind: 'local',
          baseUrls: config.orchestrator.base_urls,
          modelDir: config.orchestrator.model.name,
          client: rlClientOptions(config),
          ...(config.orchestrator.renderer ? { renderer: config.orchestrator.renderer } : {}),
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

  const result = (): RLResult => ({
    runDir,
    steps: state.trained,
    stoppedEarly: state.trained < (config.max_steps ?? Infinity),
    lastTrain: state.lastTrain,
    lastReward: state.lastReward,
  });
  const run: RLRun = { config, state, opts, stepsPerRun, activities, evaluate, runDueEvals, result };
  // The loop of executions started before completions were taken one at a time is retired: every
  // execution this version resumes recorded this patch (see EVENTS_IN_ORDER).
  deprecatePatch(EVENTS_IN_ORDER);
  return stepsInOrder(run);
}

/**
 * The patch of executions whose commands all come from `stepsInOrder` (2026-11-26). Deprecated: the
 * loop of executions started before it was deleted, so this version cannot resume those (their
 * histories hold no marker of it); finish such a run with a version of before its retirement. The
 * call stays while executions that recorded the patch undeprecated may run (a marker of it in a
 * history needs the call to replay); once every running execution recorded it deprecated, a later
 * version drops it.
 */
const EVENTS_IN_ORDER = 'events-in-order';
/** The patch of executions that run a W&B follower (runs with [wandb]). */
const WANDB_FOLLOWER = 'wandb-follower';

/** What the step loop works with: the run's state and config, its activities and its evals. */
interface RLRun {
  config: RLConfig;
  state: RLState;
  opts: RLOptions;
  stepsPerRun: number;
  activities: ReturnType<typeof runActivities>;
  /** Evaluates one policy version (an `eval` child workflow). */
  evaluate(version: number): Promise<EvalResult>;
  /** The evals due by now (`final`: and of the last version), one after another. */
  runDueEvals(final: boolean): Promise<void>;
  /** What the run returns when it ends now. */
  result(): RLResult;
}

/** A completion the run acts on. */
type Done =
  | { kind: 'rollouts'; rollouts: RolloutSummary }
  | { kind: 'batch'; batch: PackSummary }
  | { kind: 'trained'; train: TrainSummary }
  | { kind: 'checkpointed' }
  | { kind: 'recorded' }
  | { kind: 'evaluated' };

/** A step from its rollouts to its metrics line. */
interface Step {
  step: number;
  times: StepTimes;
  rollouts?: RolloutSummary;
  batch?: PackSummary;
  train?: TrainSummary;
}

/**
 * The steps of one execution. Work overlaps (the next step's rollouts beside the trainer, the
 * metrics line beside both), and every command is issued by this one loop, which takes one
 * completion at a time in the order Temporal resolved them (workflows/inbox.ts): `settle` records
 * what a completion changed and issues its immediate sequel (packing after rollouts, a due
 * checkpoint after a train step), `advance` starts what the state now allows.
 */
async function stepsInOrder(run: RLRun): Promise<RLResult> {
  const { config, state, opts, stepsPerRun } = run;
  const { cpu, cpuWrite, trainer, producer } = run.activities;
  const { runDir } = state;
  const maxSteps = config.max_steps ?? Infinity;
  const k = config.async_level;
  // Read with `?.`: configs recorded before in-flight mode existed have no such section.
  const inFlight = config.orchestrator.in_flight?.enabled === true;
  const interval = config.eval.interval;
  const startedThisRun = state.step;
  const now = () => Date.now() / 1000;
  const inbox = new Inbox<Done>();

  let producing: Step | 'eval' | undefined; // the step being generated (or claimed) and packed, or an eval
  let waitStart = now(); // since when the next step waits to be produced
  const toTrain: Step[] = []; // packed, in step order
  let training: Step | undefined; // on the trainer (its train step, then its checkpoint)
  const toRecord: Step[] = []; // trained, in step order
  let recording = false;
  let lastTrainEnd: number | undefined;
  let continuing = false; // continue-as-new is due: no new steps in this execution

  // In-flight mode: the producer runs while this execution does; it settles only by failing (one
  // retrying cannot fix), which fails the run, also while a claim waits for rollouts it would never
  // write. Cancelled before the execution ends.
  const producerScope = inFlight ? new CancellationScope() : undefined;
  if (producerScope)
    inbox.add(
      producerScope
        .run(() => producer.produceRollouts({ runDir }))
        .then(
          () => new Promise<never>(() => {}),
          (e) => (isCancellation(e) ? new Promise<never>(() => {}) : Promise.reject(e)),
        ),
    );
  /** Work in flight that will complete (the producer only fails). */
  const busy = () => inbox.size - (producerScope ? 1 : 0);

  // [wandb]: one follower of metrics.jsonl for this execution, however the run was started; it
  // never fails the run, and is cancelled (and waited for: it logs the last steps) before the
  // execution ends. Executions started before it existed have none.
  const wandbScope = config.wandb !== undefined && patched(WANDB_FOLLOWER) ? new CancellationScope() : undefined;
  const wandbDone = wandbScope?.run(() => run.activities.follower.followWandb({ runDir })).catch(() => undefined);
  const stopWandb = async () => {
    wandbScope?.cancel();
    await wandbDone;
  };

  /** Whether the next step may start: not paused or stopping, and its policy version (step - k) trained. */
  const stepMayStart = () =>
    !continuing &&
    !state.stopping &&
    !state.paused &&
    state.step < maxSteps &&
    state.trained >= Math.max(0, state.step - k);

  /** Starts what the state allows, in a fixed order: the next train step, the next metrics line, the next step (or a due eval). */
  const advance = () => {
    if (training === undefined && toTrain.length > 0) {
      const s = (training = toTrain.shift()!);
      s.times.train_start = now();
      if (inFlight && lastTrainEnd !== undefined) s.times.trainer_idle = s.times.train_start - lastTrainEnd;
      inbox.add(trainer.trainStep({ runDir, step: s.step }).then((train): Done => ({ kind: 'trained', train })));
    }
    if (!recording && toRecord.length > 0) {
      const s = toRecord.shift()!;
      recording = true;
      // In-flight mode: the oldest version the step's tokens were sampled with.
      const policyVersion = inFlight ? s.rollouts!.policyVersion : Math.max(0, s.step - k);
      const { rollouts, batch, train, times } = s as Required<Step>;
      inbox.add(
        cpuWrite
          .recordStep({ runDir, step: s.step, policyVersion, rollouts, batch, train, times })
          .then((): Done => ({ kind: 'recorded' })),
      );
    }
    if (producing !== undefined || !stepMayStart()) return;
    if (!inFlight && interval !== undefined && state.nextEval! <= state.trained) {
      // An eval of a version due before the next rollouts, run when nothing else is in flight
      // (a child workflow's completion is not ordered with activities': see Inbox).
      if (busy() > 0) return;
      producing = 'eval';
      inbox.add(run.evaluate(state.nextEval!).then((): Done => ({ kind: 'evaluated' })));
      return;
    }
    const step = state.step;
    producing = { step, times: { wait_start: waitStart, generate_start: now() } as StepTimes };
    // async_level: rollouts of step n use policy version n - k: never older (the bound), and not
    // "whatever is newest" either, so a run is reproducible whatever the timing of its workers.
    // In-flight mode: the next finished groups, once the trainer is within async_level steps.
    const rollouts = inFlight
      ? cpu.claimRollouts({ runDir, step })
      : cpu.generateRollouts({ runDir, step, policyVersion: Math.max(0, step - k) });
    inbox.add(rollouts.then((r): Done => ({ kind: 'rollouts', rollouts: r })));
  };

  /** Records what a completion changed; issues its immediate sequel. */
  const settle = (done: Done) => {
    switch (done.kind) {
      case 'rollouts': {
        const s = producing as Step;
        s.rollouts = done.rollouts;
        s.times.generate_end = now();
        inbox.add(cpu.packBatch({ runDir, step: s.step }).then((batch): Done => ({ kind: 'batch', batch })));
        return;
      }
      case 'batch': {
        const s = producing as Step;
        s.batch = done.batch;
        s.times.pack_end = now();
        state.lastReward = s.rollouts!.rewardMean;
        state.step = s.step + 1;
        toTrain.push(s);
        producing = undefined;
        waitStart = now();
        continuing = workflowInfo().continueAsNewSuggested || state.step - startedThisRun >= stepsPerRun;
        return;
      }
      case 'trained': {
        const s = training!;
        s.train = done.train;
        s.times.train_end = lastTrainEnd = now();
        state.trained = s.step + 1;
        state.lastTrain = done.train;
        if (state.trained % config.ckpt.interval === 0 || state.trained === maxSteps) {
          inbox.add(
            trainer.saveCheckpoint({ runDir, step: state.trained }).then((): Done => ({ kind: 'checkpointed' })),
          );
          return;
        }
        toRecord.push(s);
        training = undefined;
        return;
      }
      case 'checkpointed':
        toRecord.push(training!);
        training = undefined;
        return;
      case 'recorded':
        recording = false;
        return;
      case 'evaluated':
        producing = undefined;
        state.nextEval = state.nextEval! + interval!;
        waitStart = now();
        return;
    }
  };

  for (;;) {
    advance();
    if (busy() > 0) {
      settle(await inbox.next());
      continue;
    }
    // Nothing in flight and nothing to start: paused (wait for resume or stop), or this execution is done.
    if (state.paused && !state.stopping && !continuing && state.step < maxSteps) {
      await condition(() => !state.paused || state.stopping);
      waitStart = now();
      continue;
    }
    break;
  }
  producerScope?.cancel();
  if (continuing && state.step < maxSteps && !state.stopping) {
    await stopWandb();
    await continueAsNew<typeof rl>(config, state, opts);
  }
  await run.runDueEvals(true);
  await stopWandb();
  return run.result();
}
