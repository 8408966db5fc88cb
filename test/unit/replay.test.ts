/**
 * Replays recorded histories of `rl` (continue-as-new, eval children, a pause), `rl` in in-flight
 * mode (the producer and the claims, continue-as-new), `sft` (continue-as-new, validation) and
 * `eval` against the current workflow bundle: a change to workflow code that would break running
 * workflows (a nondeterminism error on replay) fails here.
 *
 * The histories in test/fixtures/histories/ are recorded with stand-in activities on the
 * time-skipping server. After an intended, incompatible change (which needs a versioning plan for
 * running workflows: `patched()` or a new workflow type), record them again:
 *
 *   npm run test:record-histories      (RECORD_HISTORIES=1 jest test/unit/replay.test.ts)
 *
 * A code path kept for executions started before a patch is retired with `deprecatePatch()` once
 * none runs, and the histories that needed it are deleted with it (workflows/rl.ts, EVENTS_IN_ORDER).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { WorkflowHandle } from '@temporalio/client';
import { temporal } from '@temporalio/proto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Worker } from '@temporalio/worker';
import {
  bundleWorkflows,
  evalConfig,
  evalPlan,
  rlConfig,
  sftConfig,
  startTestServer,
  startWorkers,
  UNIT_QUEUES,
  type Rig,
} from './mock-run';

const dir = path.join(__dirname, '..', 'fixtures', 'histories');
const RECORD = process.env.RECORD_HISTORIES === '1';

/** The recorded scenarios: workflow id (the fixture files' prefix), type and arguments. */
const scenarios: {
  id: string;
  type: 'rl' | 'sft' | 'eval';
  args: unknown[];
  rig: Rig['behaviour'];
  pauseAt?: number;
}[] = [
  {
    id: 'replay-rl',
    type: 'rl',
    pauseAt: 1,
    rig: {},
    args: [
      rlConfig([
        '--run-name',
        'replay-rl',
        '--max-steps',
        '3',
        '--async-level',
        '1',
        '--ckpt.interval',
        '2',
        '--eval.interval',
        '2',
      ]),
      undefined,
      { stepsPerRun: 2 },
    ],
  },
  {
    // In-flight mode: one producer per execution (cancelled at continue-as-new and at the end), a claim per step.
    id: 'replay-rl-inflight',
    type: 'rl',
    rig: {},
    args: [
      rlConfig([
        '--run-name',
        'replay-rl-inflight',
        '--max-steps',
        '3',
        '--async-level',
        '1',
        '--orchestrator.in-flight.enabled',
        'true',
        '--temporal.heartbeat-timeout-s',
        '5',
      ]),
      undefined,
      { stepsPerRun: 2 },
    ],
  },
  {
    id: 'replay-sft',
    type: 'sft',
    rig: { sftSteps: 3, valLoss: (s) => 1 / s },
    args: [sftConfig(['--run-name', 'replay-sft', '--val.interval', '1']), undefined, { stepsPerRun: 2 }],
  },
  {
    id: 'replay-eval',
    type: 'eval',
    rig: { evalPlan: () => evalPlan(['base', 'step_2'], ['arithmetic', 'reverse-text']) },
    args: [{ config: evalConfig(['--run-name', 'replay-eval']) }],
  },
];

/**
 * Files hold protobufjs's object form of a History (longs and enums as strings, bytes in base64), not
 * the proto-JSON of `temporal workflow show`: the SDK's historyToJSON / historyFromJSON fail in this
 * install (@temporalio/common's nested protobufjs 8 rejects the types of the top-level protobufjs 7).
 */
const History = temporal.api.history.v1.History;
const FORMAT = { longs: String, enums: String, bytes: String } as const;

const fixtures = () =>
  fs.existsSync(dir)
    ? fs
        .readdirSync(dir)
        .filter((f) => f.endsWith('.json'))
        .sort()
    : [];

(RECORD ? test : test.skip)('record the histories of every scenario into test/fixtures/histories', async () => {
  const env = await startTestServer();
  const rig: Rig = { calls: [], behaviour: {} };
  const workers = await startWorkers(env, await bundleWorkflows(), rig);
  try {
    for (const f of fixtures()) fs.rmSync(path.join(dir, f));
    fs.mkdirSync(dir, { recursive: true });
    for (const s of scenarios) {
      rig.behaviour =
        s.pauseAt === undefined
          ? s.rig
          : { ...s.rig, onGenerate: (step) => (step === s.pauseAt ? pauseBriefly(handle) : undefined) };
      const handle = await env.client.workflow.start(s.type, {
        taskQueue: UNIT_QUEUES.cpu,
        workflowId: s.id,
        args: s.args,
      });
      await handle.result();
      await save(env, s.id, handle.firstExecutionRunId);
    }
  } finally {
    await workers.stop();
    await env.teardown();
  }
  expect(fixtures().length).toBeGreaterThanOrEqual(scenarios.length);
});

/**
 * Pause and resume, both sent while an activity runs: both land in the history. (Time skipping
 * would jump a paused workflow that waits on nothing to its timeout while the test awaits it.)
 */
async function pauseBriefly(handle: WorkflowHandle): Promise<void> {
  await handle.signal('pause');
  await handle.signal('resume');
}

/** Writes every execution of `workflowId` from `runId` on (continue-as-new) and of its children, atomically. */
async function save(env: TestWorkflowEnvironment, workflowId: string, runId: string): Promise<void> {
  for (let n = 0, next: string | undefined = runId; next; n++) {
    const history = await env.client.workflow.getHandle(workflowId, next).fetchHistory();
    const file = path.join(dir, `${workflowId}.${n}.json`);
    fs.writeFileSync(
      `${file}.tmp`,
      JSON.stringify(History.toObject(History.fromObject(history), FORMAT), null, 1) + '\n',
    );
    fs.renameSync(`${file}.tmp`, file);
    for (const e of history.events ?? []) {
      const child = e.childWorkflowExecutionStartedEventAttributes?.workflowExecution;
      if (child?.workflowId && child.runId) await save(env, child.workflowId, child.runId);
    }
    next = history.events?.at(-1)?.workflowExecutionContinuedAsNewEventAttributes?.newExecutionRunId ?? undefined;
  }
}

(RECORD ? test.skip : test)('the recorded histories replay on the current workflow code', async () => {
  const files = fixtures();
  // Each scenario, its continued executions and the eval children of rl.
  for (const id of [
    'replay-rl.0',
    'replay-rl.1',
    'replay-rl-eval-0.0',
    'replay-rl-eval-2.0',
    'replay-rl-eval-3.0',
    'replay-rl-inflight.0',
    'replay-rl-inflight.1',
    'replay-sft.0',
    'replay-sft.1',
    'replay-eval.0',
  ]) {
    expect(files).toContain(`${id}.json`);
  }
  const workflowBundle = await bundleWorkflows();
  const histories = files.map((f) => ({
    workflowId: f.replace(/\.\d+\.json$/, ''),
    history: History.fromObject(JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'))),
  }));
  const failed: string[] = [];
  for await (const r of Worker.runReplayHistories({ workflowBundle }, histories)) {
    if (r.error) failed.push(`${r.workflowId} (${r.runId}): ${r.error.message}`);
  }
  expect(failed).toEqual([]);
});
