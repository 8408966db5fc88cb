/**
 * The step loop of `rl` executions started before the workflow took completions one at a time
 * (workflows/rl.ts, `EVENTS_IN_ORDER`): kept unchanged so that their histories replay. New
 * executions never run it. Its two branches (the step loop and the trainer's chain) issue commands
 * wherever their awaits resume, which a worker that answered a query between two completions can
 * order differently from a replay (workflows/inbox.ts says how): do not extend it.
 */
import {
  ApplicationFailure,
  CancellationScope,
  condition,
  continueAsNew,
  isCancellation,
  patched,
  workflowInfo,
} from '@temporalio/workflow';
import type { RolloutSummary, StepTimes } from '../activities/types';
import { stopBeforeNextStep } from './plumbing';
import type { rl, RLResult, RLRun } from './rl';

export async function legacySteps(run: RLRun): Promise<RLResult> {
  const { config, state, opts, stepsPerRun, runDueEvals } = run;
  const { cpu, cpuWrite, trainer, producer } = run.activities;
  const { runDir } = state;
  const maxSteps = config.max_steps ?? Infinity;
  const k = config.async_level;
  const inFlight = config.orchestrator.in_flight?.enabled === true;
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
    const policyVersion = Math.max(0, step - k);
    await condition(() => state.trained >= policyVersion || failure !== undefined);
    if (failure !== undefined) throw failure;
    let rollouts: RolloutSummary;
    const times: StepTimes = { wait_start: waitStart / 1000 } as StepTimes;
    if (inFlight) {
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
      const version = inFlight ? rollouts.policyVersion : policyVersion;
      const record = () => cpuWrite.recordStep({ runDir, step, policyVersion: version, rollouts, batch, train, times });
      if (!recordBesideTraining) return record();
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
  return run.result();
}
