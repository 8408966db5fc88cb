/**
 * The fast workflow tier's rig: the real workflow code (one bundle per test file) on Temporal's
 * time-skipping test server (Java, fetched by scripts/setup.sh), with the activities replaced by
 * in-memory stand-ins that log their calls. Retry backoffs and timeouts cost no wall time.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { CancelledFailure, Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { DefaultLogger, Runtime, Worker, type WorkflowBundleOption } from '@temporalio/worker';
import type { EvalPlan } from '../../activities/evaluate';
import type { PackSummary, RolloutSummary, TrainSummary } from '../../activities/types';
import type { CpuActivities, TrainerActivities } from '../../activities';
import { loadConfig } from '../../lib/config/loader';
import {
  evalSchema,
  RL_SECTIONS,
  RL_SHARED_KEYS,
  rlSchema,
  sftSchema,
  type EvalConfig,
  type RLConfig,
  type SFTConfig,
} from '../../lib/config/schemas';
import type { EnvEvalMetrics } from '../../lib/eval/metrics';
import type { EvalResults } from '../../lib/eval/results';
import { projectRoot } from '../../lib/paths';
import { taskQueues } from '../../lib/temporal/queues';
import { distWorkflowCode } from '../../workers/bundle';

// Workflows failing on purpose are logged at WARN by the worker: keep the test output to errors.
Runtime.install({ logger: new DefaultLogger('ERROR') });

const testServer = path.join(projectRoot, 'scripts', 'temporal-test-server', 'run.sh');

/** The time-skipping test server, started from the jars scripts/setup.sh fetched (never downloaded here). */
export async function startTestServer(): Promise<TestWorkflowEnvironment> {
  if (!fs.existsSync(path.join(projectRoot, 'tools', 'temporal-test-server', 'lib'))) {
    throw new Error('tools/temporal-test-server is missing: run `npm run setup` (bash scripts/setup.sh --all) first');
  }
  // The SDK waits a fixed 5 s for the server to listen; a JVM on a loaded machine can miss that.
  for (let attempt = 1; ; attempt++) {
    try {
      return await TestWorkflowEnvironment.createTimeSkipping({
        server: { executable: { type: 'existing-path', path: testServer } },
      });
    } catch (e) {
      if (attempt === 3 || !/did not start within/.test(String(e))) throw e;
    }
  }
}

/** The workflows' bundle: dist/'s prebuilt one while it is fresh, else these sources bundled now (workers/bundle.ts). */
export const bundleWorkflows = (): Promise<WorkflowBundleOption> => distWorkflowCode((line) => console.warn(line));

/** The run folder the stand-in prepare activities report (nothing is written there). */
export const RUN_DIR = '/runs/unit';
/** The task-queue prefix of every unit run, and its queues. */
const QUEUE_PREFIX = 'unit';
export const UNIT_QUEUES = taskQueues(QUEUE_PREFIX);

const cli = (schema: typeof rlSchema | typeof sftSchema | typeof evalSchema, argv: string[], shared = false) =>
  loadConfig({ schema, argv, env: {}, ...(shared ? { shared: { keys: RL_SHARED_KEYS, sections: RL_SECTIONS } } : {}) })
    .config;

/** An RL config for the stand-ins: `args` as on the command line. */
export const rlConfig = (args: string[]): RLConfig =>
  cli(
    rlSchema,
    [
      '--model.name',
      '/models/tiny',
      '--env',
      '[{"id": "reverse-text"}]',
      '--temporal.task-queue',
      QUEUE_PREFIX,
      ...args,
    ],
    true,
  ) as RLConfig;
export const sftConfig = (args: string[]): SFTConfig =>
  cli(sftSchema, ['--model.name', '/models/tiny', '--temporal.task-queue', QUEUE_PREFIX, ...args]) as SFTConfig;
export const evalConfig = (args: string[]): EvalConfig =>
  cli(evalSchema, ['--model.name', '/models/tiny', '--temporal.task-queue', QUEUE_PREFIX, ...args]) as EvalConfig;

/** One activity call as the stand-ins saw it: `trainStep 3`, `evaluate step_2/0`, ... */
export type Calls = string[];

/** How the stand-ins behave; each hook runs inside the activity, before it returns. */
export interface Behaviour {
  /** Steps of the SFT plan. */
  sftSteps?: number;
  /** Called inside prepareRun / prepareSft, before they return (the run is being prepared). */
  onPrepare?: () => Promise<void> | void;
  /** Called at the start of generateRollouts(step) (e.g. to signal the workflow mid-step). */
  onGenerate?: (step: number) => Promise<void> | void;
  /** In-flight mode: called when produceRollouts starts (attempt 1, 2, ...); throw to fail it. */
  onProduce?: (attempt: number) => Promise<void> | void;
  /** In-flight mode: called at the start of claimRollouts(step). */
  onClaim?: (step: number) => Promise<void> | void;
  /** Called at the start of trainStep(step) (sft and rl); throw to fail the step. */
  onTrain?: (step: number, attempt: number) => Promise<void> | void;
  /** Called at the start of recordStep(step) (rl). */
  onRecord?: (step: number) => Promise<void> | void;
  /** Whether trainStep(step) writes HF weights (default: every step). */
  writesWeights?: (step: number) => boolean;
  /** Validation loss after `step` SFT steps. */
  valLoss?: (step: number) => number;
  /** The plan prepareEval returns for a config (default: the base model, one env). */
  evalPlan?: (config: EvalConfig) => EvalPlan;
}

const trainSummary = (step: number, weightsDir: string | null): TrainSummary =>
  ({ step, weightsDir, metrics: { loss: 1 / (step + 1) }, progress: { step: step + 1 } }) as unknown as TrainSummary;

const metrics = (reward: number): EnvEvalMetrics => ({
  num_examples: 2,
  rollouts_per_example: 1,
  avg_at_k: reward,
  reward_std: 0,
  pass_at_k: null,
  completion_tokens_mean: 3,
});

/** Stand-ins for the cpu and trainer activities the workflows call, logging each call into `calls`. */
export function standIns(calls: Calls, b: Behaviour = {}) {
  const cpu: Partial<CpuActivities> = {
    async prepareRun(config: RLConfig) {
      calls.push(`prepareRun ${config.run_name}`);
      await b.onPrepare?.();
      return { runDir: RUN_DIR } as Awaited<ReturnType<CpuActivities['prepareRun']>>;
    },
    async rewindRun({ step }) {
      calls.push(`rewindRun ${step}`);
      return { weightsDir: null } as Awaited<ReturnType<CpuActivities['rewindRun']>>;
    },
    async generateRollouts({ step, policyVersion }) {
      calls.push(`generateRollouts ${step} v${policyVersion}`);
      await b.onGenerate?.(step);
      return { step, policyVersion, rewardMean: step / 10 } as RolloutSummary;
    },
    async produceRollouts() {
      const ctx = Context.current();
      calls.push(`produceRollouts attempt ${ctx.info.attempt}`);
      await b.onProduce?.(ctx.info.attempt);
      // Generates until cancelled: heartbeats carry the cancellation to the activity.
      while (!ctx.cancellationSignal.aborted) {
        ctx.heartbeat();
        await new Promise((r) => setTimeout(r, 20));
      }
    },
    async followWandb() {
      const ctx = Context.current();
      calls.push('followWandb');
      // Follows until cancelled, then finishes what it follows (the workflow waits for it).
      while (!ctx.cancellationSignal.aborted) {
        ctx.heartbeat();
        await new Promise((r) => setTimeout(r, 20));
      }
      calls.push('followWandb finished');
      throw new CancelledFailure('cancelled');
    },
    async claimRollouts({ step }) {
      calls.push(`claimRollouts ${step}`);
      await b.onClaim?.(step);
      return { step, policyVersion: Math.max(0, step - 1), rewardMean: step / 10 } as RolloutSummary;
    },
    async packBatch({ step }) {
      calls.push(`packBatch ${step}`);
      return { step } as PackSummary;
    },
    async recordStep({ step }) {
      calls.push(`recordStep ${step}`);
      await b.onRecord?.(step);
    },
    async prepareSft() {
      calls.push('prepareSft');
      return { runDir: RUN_DIR, steps: b.sftSteps ?? 4 } as Awaited<ReturnType<CpuActivities['prepareSft']>>;
    },
    async recordSftStep({ step, valLoss, evals }) {
      calls.push(
        `recordSftStep ${step}${valLoss === undefined ? '' : ` val=${valLoss}`}${evals ? ` evals=${evals.map((e) => e.model).join(',')}` : ''}`,
      );
    },
    async prepareEval(config: EvalConfig) {
      calls.push('prepareEval');
      return b.evalPlan?.(config) ?? evalPlan(['base']);
    },
    async evaluate({ version, env }) {
      calls.push(`evaluate ${version.name}/${env}`);
      return metrics(version.step ?? 0);
    },
    async writeEvalVersion({ version, plan, metrics: m }) {
      calls.push(`writeEvalVersion ${version.name}`);
      return {
        model: version.name,
        step: version.step,
        environments: Object.fromEntries(plan.envs.map((e, i) => [e.id, m[i]])),
      } as EvalResults;
    },
  };
  const trainer: Partial<TrainerActivities> = {
    async trainStep({ step }) {
      calls.push(`trainStep ${step}`);
      await b.onTrain?.(step, Context.current().info.attempt);
      return trainSummary(step, (b.writesWeights?.(step) ?? true) ? `${RUN_DIR}/weights/step_${step + 1}` : null);
    },
    async saveCheckpoint({ step }) {
      calls.push(`saveCheckpoint ${step}`);
      return { path: `${RUN_DIR}/checkpoints/step_${step}` };
    },
    async validate({ step }) {
      const loss = b.valLoss?.(step) ?? 1;
      calls.push(`validate ${step}`);
      return { step, loss } as Awaited<ReturnType<TrainerActivities['validate']>>;
    },
    async writeWeights({ step }) {
      calls.push(`writeWeights ${step}`);
      return { path: `${RUN_DIR}/weights/step_${step}` };
    },
  };
  return { cpu, trainer };
}

/** An eval plan over `versions` (`base` or `step_N`) and the env ids. */
export function evalPlan(versions: string[], envs = ['reverse-text']): EvalPlan {
  return {
    runDir: RUN_DIR,
    envs: envs.map((id) => ({ id, args: {} })),
    numExamples: 2,
    rolloutsPerExample: 1,
    sampling: {} as EvalPlan['sampling'],
    seqLen: 64,
    seed: 0,
    target: { kind: 'local', baseUrls: ['http://127.0.0.1:1/v1'], modelDir: '/models/tiny' } as EvalPlan['target'],
    versions: versions.map((name) => {
      const step = name === 'base' ? null : Number(name.replace('step_', ''));
      return step === null
        ? { name, step, policyVersion: 0 }
        : { name, step, policyVersion: step, weightDir: `${RUN_DIR}/weights/${name}` };
    }) as EvalPlan['versions'],
  };
}

/** What the stand-ins of running workers do now: set by each test before it starts a workflow. */
export interface Rig {
  calls: Calls;
  behaviour: Behaviour;
}

/**
 * A cpu worker (the workflow bundle + cpu stand-ins) and a trainer worker polling queue prefix `unit`
 * until `stop()`; the stand-ins log into `rig.calls` and behave as `rig.behaviour` says.
 */
export async function startWorkers(env: TestWorkflowEnvironment, bundle: WorkflowBundleOption, rig: Rig) {
  const queues = UNIT_QUEUES;
  // Stand-ins made from the rig at call time, so one pair of workers serves every test of a file.
  const live = (pick: (a: ReturnType<typeof standIns>) => object) =>
    Object.fromEntries(
      Object.keys(pick(standIns([], {}))).map((name) => [
        name,
        (...args: unknown[]) =>
          (pick(standIns(rig.calls, rig.behaviour)) as Record<string, (...a: unknown[]) => unknown>)[name](...args),
      ]),
    );
  const cpu = await Worker.create({
    connection: env.nativeConnection,
    taskQueue: queues.cpu,
    workflowBundle: bundle,
    activities: live((a) => a.cpu),
  });
  const trainer = await Worker.create({
    connection: env.nativeConnection,
    taskQueue: queues.trainer,
    activities: live((a) => a.trainer),
    maxConcurrentActivityTaskExecutions: 1,
  });
  const running = Promise.all([cpu.run(), trainer.run()]);
  return {
    async stop() {
      cpu.shutdown();
      trainer.shutdown();
      await running;
    },
  };
}

/** A failure no retry fixes, as activities raise them (lib/failures.ts types). */
export const fatal = (message: string, type: string) => ApplicationFailure.nonRetryable(message, type);
