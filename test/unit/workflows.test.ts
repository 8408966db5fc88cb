/**
 * The control paths of `rl`, `sft` and `eval` with stand-in activities on the time-skipping test
 * server: pause / resume / stop, the progress query, continue-as-new, eval scheduling, a failing
 * un-awaited training chain, retries. Activity behaviour itself is tested in the full tier.
 */
import {
  WorkflowFailedError,
  type WorkflowHandle,
  type WorkflowHandleWithFirstExecutionRunId,
} from '@temporalio/client';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Failure, describeFailure } from '../../lib/failures';
import type { EvalResult } from '../../workflows/eval';
import type { RLProgress, RLResult } from '../../workflows/rl';
import type { SftProgress, SftResult } from '../../workflows/sft';
import { settlesWithin } from '../support/processes';
import {
  bundleWorkflows,
  evalConfig,
  evalPlan,
  fatal,
  rlConfig,
  RUN_DIR,
  sftConfig,
  startTestServer,
  startWorkers,
  UNIT_QUEUES,
  type Behaviour,
  type Calls,
  type Rig,
} from './mock-run';

let env: TestWorkflowEnvironment;
let workers: Awaited<ReturnType<typeof startWorkers>>;
const rig: Rig = { calls: [], behaviour: {} };
let id = 0;

beforeAll(async () => {
  env = await startTestServer(); // first: the JVM starts fastest on an idle machine
  workers = await startWorkers(env, await bundleWorkflows(), rig);
});
afterAll(async () => {
  await workers?.stop();
  await env?.teardown();
});

/** Starts `type` with `args` on fresh workers with stand-ins; `drive` runs once it has started. */
async function run<T>(
  type: 'rl' | 'sft' | 'eval',
  args: unknown[],
  b: Behaviour = {},
  drive?: (h: WorkflowHandle) => Promise<void>,
  calls: Calls = [],
) {
  rig.calls = calls;
  rig.behaviour = b;
  const handle = await env.client.workflow.start(type, {
    taskQueue: UNIT_QUEUES.cpu,
    workflowId: `${type}-${++id}`,
    args,
  });
  await drive?.(handle);
  return { result: (await handle.result()) as T, calls, handle };
}

/** Waits (on real time: the workers run in this process) until the workflow's progress satisfies `ok`. */
async function progressUntil<P>(h: WorkflowHandle, ok: (p: P) => boolean): Promise<P> {
  for (let i = 0; i < 200; i++) {
    const p = await h.query<P>('progress');
    if (ok(p)) return p;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`progress of ${h.workflowId} never satisfied ${ok}`);
}

/** An activity hook that sends `name` at `step`: the signal arrives at a known point of the run. */
const signalAt = (step: number, name: 'pause' | 'stop', handle: () => WorkflowHandle) => async (s: number) => {
  if (s === step) await handle().signal(name);
};

describe('rl', () => {
  test('async_level 1: rollouts of step n use version n-1, every step trains, checkpoints and records once, in order', async () => {
    const { result, calls } = await run<RLResult>('rl', [
      rlConfig(['--run-name', 'r', '--max-steps', '3', '--async-level', '1', '--ckpt.interval', '2']),
    ]);
    expect(result).toEqual({
      runDir: RUN_DIR,
      steps: 3,
      stoppedEarly: false,
      lastTrain: expect.objectContaining({ step: 2 }),
      lastReward: 0.2,
    });
    expect(calls.filter((c) => c.startsWith('generateRollouts'))).toEqual([
      'generateRollouts 0 v0',
      'generateRollouts 1 v0',
      'generateRollouts 2 v1',
    ]);
    // The trainer's chain in order; each metrics line after its step's train (and checkpoint), in order.
    expect(calls.filter((c) => /^(trainStep|saveCheckpoint)/.test(c))).toEqual([
      'trainStep 0',
      'trainStep 1',
      'saveCheckpoint 2',
      'trainStep 2',
      'saveCheckpoint 3',
    ]);
    expect(calls.filter((c) => c.startsWith('recordStep'))).toEqual(['recordStep 0', 'recordStep 1', 'recordStep 2']);
    expect(calls.indexOf('recordStep 1')).toBeGreaterThan(calls.indexOf('saveCheckpoint 2'));
    expect(calls.indexOf('recordStep 2')).toBeGreaterThan(calls.indexOf('saveCheckpoint 3'));
    // Step 2 needs version 1: it is generated only after train step 0 finished.
    expect(calls.indexOf('generateRollouts 2 v1')).toBeGreaterThan(calls.indexOf('trainStep 0'));
  });

  test('the next train step does not wait for the metrics line of the step before', async () => {
    // recordStep 0 holds until trainStep 1 has started (or 20 s pass, and the test fails).
    let train1Started: () => void = () => {};
    const started = new Promise<void>((r) => (train1Started = r));
    let overlapped = false;
    await run<RLResult>('rl', [rlConfig(['--run-name', 'rec', '--max-steps', '3', '--async-level', '1'])], {
      onTrain: (step) => void (step === 1 && train1Started()),
      onRecord: async (step) => {
        if (step !== 0) return;
        overlapped = await settlesWithin(started, 20_000);
      },
    });
    expect(overlapped).toBe(true);
  });

  test('while the run is prepared, progress answers `preparing` and a pause sent then holds step 0', async () => {
    let handle: WorkflowHandle | undefined;
    let during: RLProgress | undefined;
    const { result, calls } = await run<RLResult>(
      'rl',
      [rlConfig(['--run-name', 'prep', '--max-steps', '1'])],
      {
        onPrepare: async () => {
          while (!handle) await new Promise((r) => setTimeout(r, 5));
          during = await handle!.query<RLProgress>('progress');
          await handle!.signal('pause');
        },
      },
      async (h) => {
        handle = h;
        const paused = await progressUntil<RLProgress>(h, (p) => !('preparing' in p) && p.paused);
        expect(paused.trained).toBe(0);
        await h.signal('resume');
      },
    );
    expect(during).toEqual({ preparing: true, trained: 0, paused: false, stopping: false, maxSteps: 1 });
    expect(result.steps).toBe(1);
    // Paused before step 0: nothing was generated until the resume.
    expect(calls[0]).toBe('prepareRun prep');
  });

  test('pause holds the next step (the one training finishes), the progress query shows it, resume goes on', async () => {
    let handle!: WorkflowHandle;
    let paused: RLProgress | undefined;
    let callsWhilePaused: number | undefined;
    const { result, calls } = await run<RLResult>(
      'rl',
      [rlConfig(['--run-name', 'p', '--max-steps', '4', '--async-level', '1'])],
      { onGenerate: signalAt(1, 'pause', () => handle) },
      async (h) => {
        handle = h;
        paused = await progressUntil<RLProgress>(h, (p) => p.paused && p.trained === 2);
        callsWhilePaused = (await h.query<RLProgress & { step: number }>('progress')).step;
        await h.signal('resume');
      },
    );
    // Paused after step 1 was generated: step 2 waits, step 1 still trains.
    expect(paused).toMatchObject({
      runDir: RUN_DIR,
      step: 2,
      trained: 2,
      paused: true,
      stopping: false,
      maxSteps: 4,
      lastReward: 0.1,
    });
    expect(callsWhilePaused).toBe(2);
    expect(calls.indexOf('generateRollouts 2 v1')).toBeGreaterThan(calls.indexOf('trainStep 1'));
    expect(result).toMatchObject({ steps: 4, stoppedEarly: false });
  });

  test('stop finishes the steps in flight and ends the run early', async () => {
    let handle!: WorkflowHandle;
    const { result, calls } = await run<RLResult>(
      'rl',
      [rlConfig(['--run-name', 's', '--max-steps', '10', '--async-level', '2'])],
      { onGenerate: signalAt(2, 'stop', () => handle) },
      async (h) => {
        handle = h;
      },
    );
    expect(result).toMatchObject({ steps: 3, stoppedEarly: true });
    expect(calls.filter((c) => c.startsWith('trainStep'))).toEqual(['trainStep 0', 'trainStep 1', 'trainStep 2']);
    expect(calls.filter((c) => c.startsWith('generateRollouts'))).toHaveLength(3);
  });

  test('continue-as-new every stepsPerRun steps carries the state: prepared once, every step once', async () => {
    const { result, calls, handle } = await run<RLResult>('rl', [
      rlConfig(['--run-name', 'c', '--max-steps', '5', '--async-level', '1']),
      undefined,
      { stepsPerRun: 2 },
    ]);
    expect(result).toMatchObject({ steps: 5, stoppedEarly: false });
    expect(calls.filter((c) => c.startsWith('prepareRun'))).toEqual(['prepareRun c']);
    expect(calls.filter((c) => c.startsWith('trainStep'))).toEqual([0, 1, 2, 3, 4].map((s) => `trainStep ${s}`));
    expect(calls.filter((c) => c.startsWith('generateRollouts'))).toEqual([
      'generateRollouts 0 v0',
      ...[1, 2, 3, 4].map((s) => `generateRollouts ${s} v${s - 1}`),
    ]);
    const runs = await executionChain(handle);
    expect(runs).toHaveLength(3); // steps 0-1, 2-3, 4
  });

  test('eval.interval: the base model, every interval-th version and the last, each before the rollouts that follow', async () => {
    const { result, calls } = await run<RLResult>('rl', [
      rlConfig(['--run-name', 'e', '--max-steps', '5', '--async-level', '1', '--eval.interval', '2']),
      undefined,
      { stepsPerRun: 3 },
    ]);
    expect(result.steps).toBe(5);
    expect(calls.filter((c) => c.startsWith('writeEvalVersion'))).toEqual([
      'writeEvalVersion base',
      'writeEvalVersion step_2',
      'writeEvalVersion step_4',
      'writeEvalVersion step_5',
    ]);
    // Version 2 exists once train step 1 finished; it is evaluated before the next rollouts.
    const evalOf2 = calls.indexOf('evaluate step_2/0');
    expect(evalOf2).toBeGreaterThan(calls.indexOf('trainStep 1'));
    expect(calls[evalOf2 + 2]).toMatch(/^generateRollouts 3 /);
    // The last version is evaluated after the last step was recorded.
    expect(calls.indexOf('evaluate step_5/0')).toBeGreaterThan(calls.indexOf('recordStep 4'));
  });

  test('ckpt.resume_step rewinds the run folder and starts there (evals due from the next interval)', async () => {
    const { result, calls } = await run<RLResult>('rl', [
      rlConfig([
        '--run-name',
        'rs',
        '--max-steps',
        '4',
        '--async-level',
        '0',
        '--ckpt.resume-step',
        '2',
        '--eval.interval',
        '2',
      ]),
    ]);
    expect(result).toMatchObject({ steps: 4, stoppedEarly: false });
    expect(calls.slice(0, 2)).toEqual(['prepareRun rs', 'rewindRun 2']);
    expect(calls.filter((c) => c.startsWith('trainStep'))).toEqual(['trainStep 2', 'trainStep 3']);
    expect(calls.filter((c) => c.startsWith('writeEvalVersion'))).toEqual([
      'writeEvalVersion step_2',
      'writeEvalVersion step_4',
    ]);
  });

  test('a train step that fails for good fails the run with its message, though nothing awaited it', async () => {
    const b: Behaviour = {
      onTrain: (step) => {
        if (step === 1) throw fatal('train step 1 produced weights with NaN or Inf', Failure.NonFiniteWeights);
      },
    };
    const calls: Calls = [];
    const err = await run<RLResult>(
      'rl',
      [rlConfig(['--run-name', 'f', '--max-steps', '10', '--async-level', '1'])],
      b,
      undefined,
      calls,
    ).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(WorkflowFailedError);
    expect(describeFailure(err as Error).message).toBe(
      'Workflow execution failed: Activity task failed (trainStep): train step 1 produced weights with NaN or Inf',
    );
    expect(failureType(err)).toBe(Failure.NonFiniteWeights);
    // Step 3 needs version 2, which never comes: the run fails instead of waiting for it forever.
    expect(calls.filter((c) => c.startsWith('generateRollouts'))).toEqual([
      'generateRollouts 0 v0',
      'generateRollouts 1 v0',
      'generateRollouts 2 v1',
    ]);
  });

  test('a retryable train failure is retried (backoff skipped in time) and the run completes', async () => {
    const b: Behaviour = {
      onTrain: (step, attempt) => {
        if (step === 1 && attempt < 3) throw new Error('trainer worker lost');
      },
    };
    const { result, calls } = await run<RLResult>(
      'rl',
      [rlConfig(['--run-name', 'rt', '--max-steps', '3', '--async-level', '1'])],
      b,
    );
    expect(result).toMatchObject({ steps: 3, stoppedEarly: false });
    expect(calls.filter((c) => c === 'trainStep 1')).toHaveLength(3);
    expect(calls.filter((c) => c.startsWith('recordStep'))).toEqual(['recordStep 0', 'recordStep 1', 'recordStep 2']);
  });
});

describe('rl, [wandb]', () => {
  test('one W&B follower per execution, cancelled and waited for before it ends or continues as new', async () => {
    const { result, calls, handle } = await run<RLResult>('rl', [
      rlConfig(['--run-name', 'wb', '--max-steps', '3', '--wandb.project', 'p', '--temporal.heartbeat-timeout-s', '5']),
      undefined,
      { stepsPerRun: 2 },
    ]);
    expect(result).toMatchObject({ steps: 3, stoppedEarly: false });
    expect(await executionChain(handle)).toHaveLength(2);
    // Each execution's follower finished (logged the last steps) before the next one started.
    expect(calls.filter((c) => c.startsWith('followWandb'))).toEqual([
      'followWandb',
      'followWandb finished',
      'followWandb',
      'followWandb finished',
    ]);
    expect(calls.lastIndexOf('followWandb finished')).toBeGreaterThan(calls.indexOf('recordStep 2'));
  });

  test('a run without [wandb] has none', async () => {
    const { calls } = await run<RLResult>('rl', [rlConfig(['--run-name', 'nowb', '--max-steps', '1'])]);
    expect(calls.filter((c) => c.startsWith('followWandb'))).toEqual([]);
  });
});

describe('rl, in-flight mode', () => {
  // A short heartbeat timeout: a cancelled producer learns it at its next heartbeat (within 80% of it).
  const inFlight = (name: string, steps: number, ...more: string[]) =>
    rlConfig([
      '--run-name',
      name,
      '--max-steps',
      String(steps),
      '--orchestrator.in-flight.enabled',
      'true',
      '--temporal.heartbeat-timeout-s',
      '5',
      ...more,
    ]);

  test('one producer per execution; each step claims its rollouts once, in order, and trains and records once', async () => {
    const { result, calls, handle } = await run<RLResult>('rl', [
      inFlight('if', 5, '--async-level', '1'),
      undefined,
      { stepsPerRun: 2 },
    ]);
    expect(result).toMatchObject({ steps: 5, stoppedEarly: false });
    expect(calls.filter((c) => c.startsWith('generateRollouts'))).toEqual([]);
    expect(calls.filter((c) => c.startsWith('claimRollouts'))).toEqual(
      [0, 1, 2, 3, 4].map((s) => `claimRollouts ${s}`),
    );
    expect(calls.filter((c) => c.startsWith('trainStep'))).toEqual([0, 1, 2, 3, 4].map((s) => `trainStep ${s}`));
    expect(calls.filter((c) => c.startsWith('recordStep'))).toEqual([0, 1, 2, 3, 4].map((s) => `recordStep ${s}`));
    // Continue-as-new every 2 steps: each of the 3 executions started its own producer.
    expect(await executionChain(handle)).toHaveLength(3);
    expect(calls.filter((c) => c.startsWith('produceRollouts'))).toEqual(Array(3).fill('produceRollouts attempt 1'));
    // async_level 1: step 2 is claimed only once train step 0 finished (its batch stays fresh).
    expect(calls.indexOf('claimRollouts 2')).toBeGreaterThan(calls.indexOf('trainStep 0'));
  });

  test('a producer that crashed is retried and the run goes on', async () => {
    let retried!: () => void;
    const secondAttempt = new Promise<void>((r) => (retried = r));
    const { result, calls } = await run<RLResult>('rl', [inFlight('ifr', 3)], {
      onProduce: (attempt) => {
        if (attempt === 1) throw new Error('inference server unreachable');
        retried();
      },
      // Rollouts come from the producer: step 0 finds them once it runs again.
      onClaim: () => secondAttempt,
    });
    expect(result.steps).toBe(3);
    expect(calls.filter((c) => c.startsWith('produceRollouts'))).toEqual([
      'produceRollouts attempt 1',
      'produceRollouts attempt 2',
    ]);
  });

  test('a producer that fails for good fails the run with its message, also while a claim waits for rollouts', async () => {
    const calls: Calls = [];
    let release!: () => void;
    const claimWaits = new Promise<void>((r) => (release = r));
    const err = await run<RLResult>(
      'rl',
      [inFlight('iff', 3)],
      {
        onProduce: () => {
          throw fatal('inference rejected the run: HTTP 401', Failure.InferenceRejected);
        },
        // The claim waits for rollouts that never come (released once the run failed, so the worker can stop).
        onClaim: () => claimWaits,
      },
      undefined,
      calls,
    ).catch((e: unknown) => e);
    release();
    expect(err).toBeInstanceOf(WorkflowFailedError);
    expect(describeFailure(err as Error).message).toBe(
      'Workflow execution failed: Activity task failed (produceRollouts): inference rejected the run: HTTP 401',
    );
    expect(failureType(err)).toBe(Failure.InferenceRejected);
    expect(calls.filter((c) => c.startsWith('trainStep'))).toEqual([]);
  });

  test('evals between steps are refused in in-flight mode, naming the key', () => {
    expect(() => inFlight('ife', 3, '--eval.interval', '2')).toThrow(/eval\.interval.*in_flight/s);
  });
});

describe('sft', () => {
  test('evals during SFT: the base model first, every eval.interval steps and the end, as children; continue-as-new carries the next', async () => {
    const cfg = sftConfig([
      ...[
        '--run-name',
        'se',
        '--eval.interval',
        '2',
        '--eval.env',
        '[{"id": "reverse-text", "rollouts_per_example": 2}]',
      ],
    ]);
    const { result, calls } = await run<SftResult>('sft', [cfg, undefined, { stepsPerRun: 2 }], {
      sftSteps: 5,
      // Step 2's weights are not written by its train step: the eval has them written.
      writesWeights: (s) => s !== 1,
    });
    expect(result.steps).toBe(5);
    expect(calls.filter((c) => /^(evaluate|writeWeights|recordSftStep|writeEvalVersion)/.test(c))).toEqual([
      'evaluate base/0',
      'writeEvalVersion base',
      'recordSftStep 0',
      'writeWeights 2',
      'evaluate step_2/0',
      'writeEvalVersion step_2',
      'recordSftStep 1 evals=step_2',
      'recordSftStep 2',
      'evaluate step_4/0',
      'writeEvalVersion step_4',
      'recordSftStep 3 evals=step_4',
      'evaluate step_5/0',
      'writeEvalVersion step_5',
      'recordSftStep 4 evals=step_5',
    ]);
  });

  test('validation, checkpoints and metrics per step; continue-as-new carries the state', async () => {
    const cfg = sftConfig(['--run-name', 'sf', '--val.interval', '2', '--ckpt.interval', '3']);
    const { result, calls, handle } = await run<SftResult>('sft', [cfg, undefined, { stepsPerRun: 2 }], {
      sftSteps: 5,
      valLoss: (s) => 1 / s,
    });
    expect(result).toEqual({
      runDir: RUN_DIR,
      steps: 5,
      stoppedEarly: false,
      reachedTarget: false,
      lastTrain: expect.objectContaining({ step: 4 }),
      lastValLoss: 0.2,
      weightsDir: `${RUN_DIR}/weights/step_5`,
    });
    expect(calls.filter((c) => c === 'prepareSft')).toHaveLength(1);
    expect(calls.filter((c) => /^(validate|saveCheckpoint|recordSftStep)/.test(c))).toEqual([
      'recordSftStep 0',
      'validate 2',
      'recordSftStep 1 val=0.5',
      'saveCheckpoint 3',
      'recordSftStep 2',
      'validate 4',
      'recordSftStep 3 val=0.25',
      'validate 5',
      'saveCheckpoint 5',
      'recordSftStep 4 val=0.2',
    ]);
    expect(await executionChain(handle)).toHaveLength(3);
  });

  test('val.target_loss reached: the run ends there with a checkpoint and its weights', async () => {
    const cfg = sftConfig([
      '--run-name',
      'st',
      '--val.interval',
      '1',
      '--val.target-loss',
      '0.3',
      '--ckpt.interval',
      '10',
    ]);
    const { result, calls } = await run<SftResult>('sft', [cfg], {
      sftSteps: 8,
      valLoss: (s) => 1 / s,
      writesWeights: () => false,
    });
    expect(result).toMatchObject({ steps: 4, stoppedEarly: false, reachedTarget: true, lastValLoss: 0.25 });
    // Step 4 wrote no weights (not a checkpoint step): the workflow has them written.
    expect(calls.slice(-4)).toEqual(['validate 4', 'saveCheckpoint 4', 'recordSftStep 3 val=0.25', 'writeWeights 4']);
    expect(result.weightsDir).toBe(`${RUN_DIR}/weights/step_4`);
    expect(calls.filter((c) => c.startsWith('saveCheckpoint'))).toEqual(['saveCheckpoint 4']);
  });

  test('pause, progress, stop: the run ends early after the step in flight', async () => {
    let handle!: WorkflowHandle;
    let seen: SftProgress | undefined;
    const b: Behaviour = {
      sftSteps: 6,
      onTrain: async (step) => {
        if (step === 1) await handle.signal('pause');
      },
    };
    const { result, calls } = await run<SftResult>('sft', [sftConfig(['--run-name', 'sp'])], b, async (h) => {
      handle = h;
      seen = await progressUntil<SftProgress>(h, (p) => p.paused && p.trained === 2);
      await h.signal('stop');
    });
    expect(seen).toMatchObject({ runDir: RUN_DIR, steps: 6, maxSteps: 6, trained: 2, paused: true, stopping: false });
    expect(result).toMatchObject({ steps: 2, stoppedEarly: true, reachedTarget: false });
    expect(calls.filter((c) => c.startsWith('trainStep'))).toEqual(['trainStep 0', 'trainStep 1']);
  });
});

describe('eval', () => {
  test('a config: versions one after another, the envs of a version side by side, results in order', async () => {
    const b: Behaviour = { evalPlan: () => evalPlan(['base', 'step_10', 'step_20'], ['arithmetic', 'reverse-text']) };
    const { result, calls } = await run<EvalResult>('eval', [{ config: evalConfig(['--run-name', 'ev']) }], b);
    expect(result.runDir).toBe(RUN_DIR);
    expect(result.results.map((r) => [r.model, r.step, Object.keys(r.environments)])).toEqual([
      ['base', null, ['arithmetic', 'reverse-text']],
      ['step_10', 10, ['arithmetic', 'reverse-text']],
      ['step_20', 20, ['arithmetic', 'reverse-text']],
    ]);
    expect(calls.filter((c) => c.startsWith('writeEvalVersion'))).toEqual([
      'writeEvalVersion base',
      'writeEvalVersion step_10',
      'writeEvalVersion step_20',
    ]);
    // Version step_10 starts only once base is written.
    expect(calls.indexOf('evaluate step_10/0')).toBeGreaterThan(calls.indexOf('writeEvalVersion base'));
  });

  test('a plan the config cannot make fails with the message the user sees', async () => {
    const b: Behaviour = {
      evalPlan: () => {
        throw fatal('eval: no weight folder step_30 under /w (have: step_10, step_20)', Failure.InvalidConfig);
      },
    };
    const err = await run<EvalResult>('eval', [{ config: evalConfig(['--run-name', 'ev-bad']) }], b).catch(
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(WorkflowFailedError);
    expect(failureType(err)).toBe(Failure.InvalidConfig);
    expect(describeFailure(err as Error)).toMatchObject({ badInput: true });
    expect(describeFailure(err as Error).message).toContain(
      'no weight folder step_30 under /w (have: step_10, step_20)',
    );
  });
});

/** The type of the innermost failure of a chain (an activity's ApplicationFailure). */
function failureType(e: unknown): string | undefined {
  let type: string | undefined;
  for (let c: unknown = e; c instanceof Error; c = c.cause) type = (c as { type?: string }).type ?? type;
  return type;
}

/** The run ids of a workflow's executions, first to last, following continue-as-new. */
async function executionChain(handle: WorkflowHandleWithFirstExecutionRunId): Promise<string[]> {
  const runs: string[] = [];
  let runId: string | undefined = handle.firstExecutionRunId;
  while (runId) {
    runs.push(runId);
    const history = await env.client.workflow.getHandle(handle.workflowId, runId).fetchHistory();
    const last = history.events?.at(-1);
    runId = last?.workflowExecutionContinuedAsNewEventAttributes?.newExecutionRunId ?? undefined;
  }
  return runs;
}
