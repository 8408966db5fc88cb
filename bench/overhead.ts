/**
 * Orchestration overhead of a real RL run at the reverse-text size: `prime-rl rl @
 * configs/reverse_text/rl.toml` as a user runs it (launcher, inference server, cpu and trainer
 * worker processes), against a Temporal dev server this benchmark owns, so that the run's history
 * can be read afterwards. From the run's metrics and its history, medians over the steps after the
 * first two:
 *
 *   step time           between consecutive train-step ends (the run is train-bound here: async_level 1)
 *   trainer own time    what the trainer measured itself (batch load, fwd+bwd+optimizer, weights write)
 *   overhead            step time - trainer own time: everything that is not training, as a share
 *   trainer idle        from one trainStep's completion to the next one's start, per the history
 *   and each activity's dispatch (scheduled -> started) and the workflow tasks' latencies.
 *
 *   npm run bench:overhead [-- --model DIR --steps 40 --cli OTHER_CHECKOUT]
 *
 * --model: the policy to start from; default the newest SFT weights of `npm run reverse-text`
 * (outputs/reverse-text-sft/weights/step_N), else the example's model with random weights (whose
 * rollouts run to max_tokens, so steps are longer). --cli: run another checkout's bin/prime-rl.js
 * and configs (e.g. a worktree of an older commit, for before/after figures in one session).
 * Keeps the run to one workflow execution (steps <= 100), whose history it reads.
 */
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { tsToMs } from '@temporalio/common/lib/time';
import { temporal } from '@temporalio/proto';
import { createModel } from '../lib/model/create';
import { freePort } from '../lib/net';
import { readStepMetrics } from '../lib/runfolder/metrics';
import { RunLayout } from '../lib/runfolder/layout';
import { startDevServer } from '../lib/temporal/devserver';

const ROOT = path.resolve(__dirname, '..', '..');
const EventType = temporal.api.enums.v1.EventType;

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const ms = (s: number) => `${(s * 1000).toFixed(1)}`;

/** The newest SFT weights of the reverse-text example, if it ran in this checkout. */
function exampleWeights(): string | undefined {
  const dir = path.join(ROOT, 'outputs', 'reverse-text-sft', 'weights');
  if (!fs.existsSync(dir)) return undefined;
  const steps = fs
    .readdirSync(dir)
    .map((d) => /^step_(\d+)$/.exec(d)?.[1])
    .filter((s): s is string => s !== undefined)
    .map(Number)
    .sort((a, b) => a - b);
  return steps.length > 0 ? path.join(dir, `step_${steps[steps.length - 1]}`) : undefined;
}

interface Span {
  name: string;
  scheduled: number;
  started?: number;
  completed?: number;
}

/** Activity spans and workflow-task latencies (seconds) from a history. */
function spans(history: temporal.api.history.v1.IHistory): {
  activities: Span[];
  wftDispatch: number[];
  wftRun: number[];
} {
  const activities = new Map<number, Span>();
  const wftDispatch: number[] = [];
  const wftRun: number[] = [];
  let wftScheduled = 0;
  let wftStarted = 0;
  for (const e of history.events ?? []) {
    const t = tsToMs(e.eventTime) / 1000;
    const id = Number(e.eventId);
    switch (e.eventType) {
      case EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        activities.set(id, { name: e.activityTaskScheduledEventAttributes!.activityType!.name!, scheduled: t });
        break;
      case EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
        activities.get(Number(e.activityTaskStartedEventAttributes!.scheduledEventId))!.started = t;
        break;
      case EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
        activities.get(Number(e.activityTaskCompletedEventAttributes!.scheduledEventId))!.completed = t;
        break;
      case EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
        wftScheduled = t;
        break;
      case EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
        wftStarted = t;
        wftDispatch.push(t - wftScheduled);
        break;
      case EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
        wftRun.push(t - wftStarted);
        break;
    }
  }
  return { activities: [...activities.values()], wftDispatch, wftRun };
}

async function main() {
  const steps = Number(arg('steps', '40'));
  if (!(steps >= 4 && steps <= 100)) throw new Error('--steps: 4 to 100 (one workflow execution)');
  const checkout = path.resolve(arg('cli', ROOT));
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-bench-overhead-'));
  let model = process.argv.includes('--model') ? path.resolve(arg('model', '')) : exampleWeights();
  let modelNote = model ?? '';
  if (model === undefined) {
    // The example's model (examples/reverse_text/run.sh), untrained.
    model = path.join(root, 'model');
    createModel({
      arch: 'qwen3',
      preset: 'tiny',
      tokenizer: 'bytes',
      seed: 0,
      out: model,
      hiddenSize: 128,
      intermediateSize: 384,
      numLayers: 4,
      numHeads: 8,
      numKvHeads: 8,
    });
    modelNote = "the example's model with random weights (no reverse-text SFT weights in outputs/)";
  }
  const [port, uiPort, inferencePort] = [await freePort(), await freePort(), await freePort()];
  const server = await startDevServer({
    ip: '127.0.0.1',
    port,
    uiPort,
    namespace: 'default',
    dbFile: path.join(root, 'temporal.db'),
    logFile: path.join(root, 'temporal.log'),
  });
  const outputDir = path.join(root, 'outputs');
  const runName = 'overhead';
  try {
    process.stderr.write(`run: ${steps} steps from ${modelNote} (${checkout})\n`);
    execFileSync(
      process.execPath,
      [
        path.join(checkout, 'bin', 'prime-rl.js'),
        'rl',
        '@',
        path.join(checkout, 'configs', 'reverse_text', 'rl.toml'),
        '--model.name',
        model,
        '--run-name',
        runName,
        '--output-dir',
        outputDir,
        '--max-steps',
        String(steps),
        '--temporal.address',
        server.endpoint.address,
        '--temporal.task-queue',
        `overhead-${process.pid}`,
        '--inference.server.port',
        String(inferencePort),
        // The start's evaluation is not a step: keep it short.
        '--eval.num-examples',
        '8',
        '--eval.interval',
        '1000',
      ],
      { cwd: checkout, stdio: ['ignore', 'ignore', 'inherit'] },
    );
    const lines = readStepMetrics(RunLayout.of(outputDir, runName).metricsFile).slice(2);
    type Times = { train_end: number };
    const stepTime = lines.slice(1).map((l, i) => (l.time as Times).train_end - (lines[i]!.time as Times).train_end);
    const own = lines.map((l) => Object.values(l.seconds as Record<string, number>).reduce((a, b) => a + b, 0));
    const connection = await Connection.connect({ address: server.endpoint.address });
    const history = await new Client({ connection }).workflow.getHandle(runName).fetchHistory();
    await connection.close();
    const { activities, wftDispatch, wftRun } = spans(history);
    const train = activities.filter((a) => a.name === 'trainStep').sort((a, b) => a.scheduled - b.scheduled);
    const idle = train.slice(3).map((a, i) => a.started! - train[i + 2]!.completed!);
    const step = median(stepTime);
    const ownMedian = median(own);
    const rows = [
      `| step time | ${ms(step)} |`,
      `| trainer own time (load + train + weights) | ${ms(ownMedian)} |`,
      `| **overhead: step - own** | **${ms(step - ownMedian)} (${(((step - ownMedian) / step) * 100).toFixed(1)}%)** |`,
      `| trainer idle between train steps (history) | ${ms(median(idle))} |`,
      `| workflow task: dispatch / run | ${ms(median(wftDispatch))} / ${ms(median(wftRun))} |`,
      ...[...new Set(activities.map((a) => a.name))].map((name) => {
        const as = activities.filter((a) => a.name === name && a.started !== undefined && a.completed !== undefined);
        return `| ${name} (${as.length}): dispatch / run | ${ms(median(as.map((a) => a.started! - a.scheduled)))} / ${ms(median(as.map((a) => a.completed! - a.started!)))} |`;
      }),
    ];
    console.log(`\nreverse-text RL, ${steps} steps, medians over steps 2..${steps - 1} (ms)\n`);
    console.log('| | ms |\n|---|---:|');
    for (const r of rows) console.log(r);
  } finally {
    await server.endpoint.stop();
    fs.rmSync(root, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
