/**
 * RL pipeline benchmark: the same short run with async_level 0, 1 and 2, through a real Temporal
 * dev server, real workers (in this process), a real inference server.
 *
 *   npm run build:ts && node dist/bench/rl.js [--steps 8] [--hidden 256] [--layers 4]
 *     [--model DIR] [--lr 1e-4] [--envs JSON] [--max-tokens 32] [--modes [--window 10] [--every 60] [--curve-env ID]]
 *
 * `--model DIR` trains an existing model (e.g. the reverse-text example's SFT weights, so that the
 * reward moves) instead of a random one; `--envs` replaces the run's `[[env]]` list.
 *
 * With `--modes`: strict mode against in-flight mode, with and without keep_mix (all async_level
 * 1), on an env mix whose rollouts differ widely in length (reverse-text: one turn; guess-number:
 * up to 6 turns): step time, the trainer's idle fraction, the first env's share of each batch,
 * in-flight mode's concurrency, groups left over and off-policy distance, and the rewards per step,
 * each with its time since the start; then both reward curves at equal steps and at equal wall time.
 *
 * Per run: mean step time (between consecutive train ends, after the first step), mean generation
 * and train time, and the orchestration overhead: a step's activity spans as the workflow saw
 * them minus the durations the activities measured themselves.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { DefaultLogger, NativeConnection, Runtime, Worker } from '@temporalio/worker';
import { createCpuActivities, createTrainerActivities } from '../activities';
import { readRollouts } from '../lib/runfolder/rollouts';
import { loadConfig } from '../lib/config/loader';
import { inferenceSchema, RL_SECTIONS, RL_SHARED_KEYS, rlSchema } from '../lib/config/schemas';
import { EnvPool } from '../lib/envs/pool';
import { startInferenceServer } from '../lib/inference/server';
import { createModel } from '../lib/model/create';
import { RunLayout } from '../lib/runfolder/layout';
import { readStepMetrics } from '../lib/runfolder/metrics';
import { startDevServer } from '../lib/temporal/devserver';
import { taskQueues } from '../lib/temporal/queues';
import { freePort } from '../lib/net';

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

interface Times {
  generate_start: number;
  generate_end: number;
  pack_end: number;
  train_start: number;
  train_end: number;
}

async function main() {
  Runtime.install({ logger: new DefaultLogger('WARN') });
  const steps = Number(arg('steps', '8'));
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-bench-rl-'));
  const given = process.argv.includes('--model') ? path.resolve(arg('model', '')) : undefined;
  const modelDir = given ?? path.join(root, 'model');
  const params = given
    ? undefined
    : createModel({
        arch: 'qwen3',
        preset: 'tiny',
        tokenizer: 'bytes',
        seed: 0,
        out: modelDir,
        hiddenSize: Number(arg('hidden', '256')),
        numLayers: Number(arg('layers', '4')),
        intermediateSize: 3 * Number(arg('hidden', '256')),
        numHeads: 4,
        numKvHeads: 2,
      }).parameterCount;
  const modelText = given ? `${given}` : `qwen3 ${(params! / 1e6).toFixed(2)}M params, byte tokenizer`;
  const lr = arg('lr', '1e-4');
  const maxTokens = arg('max-tokens', '32');
  const [port, uiPort] = [await freePort(), await freePort()];
  const temporal = (
    await startDevServer({
      ip: '127.0.0.1',
      port,
      uiPort,
      namespace: 'default',
      dbFile: path.join(root, 't.db'),
      logFile: path.join(root, 't.log'),
    })
  ).endpoint;
  const outputDir = path.join(root, 'outputs');
  const inference = await startInferenceServer(
    inferenceSchema.parse({
      model: { name: modelDir },
      seq_len: 256,
      output_dir: outputDir,
      server: { port: 0 },
      threads: 1,
    }),
  );
  const pool = new EnvPool({ workers: 1, timeoutS: 60 });
  const connection = await NativeConnection.connect({ address: temporal.address });
  const client = new Client({ connection: await Connection.connect({ address: temporal.address }) });
  const rows: string[] = [];
  /** Per mode (--modes): each step's mean reward and when its training ended, seconds since the run's start. */
  const curves: { name: string; points: { reward: number; at: number }[] }[] = [];
  const modes = process.argv.includes('--modes');
  const curveEnv = process.argv.includes('--curve-env') ? arg('curve-env', '') : undefined;
  const envs = arg('envs', modes ? '[{"id": "reverse-text"}, {"id": "guess-number"}]' : '[{"id": "reverse-text"}]');
  const variants = modes
    ? [
        { name: 'strict', k: 1, args: ['--env', envs] },
        { name: 'in-flight', k: 1, args: ['--env', envs, '--orchestrator.in-flight.enabled', 'true'] },
        {
          name: 'in-flight-keep-mix',
          k: 1,
          args: [
            '--env',
            envs,
            '--orchestrator.in-flight.enabled',
            'true',
            '--orchestrator.in-flight.keep-mix',
            'true',
          ],
        },
      ]
    : [0, 1, 2].map((k) => ({ name: `async-${k}`, k, args: ['--env', envs] }));
  try {
    for (const { name, k, args } of variants) {
      const cfg = loadConfig({
        schema: rlSchema,
        argv: [
          '--run-name',
          name,
          '--model.name',
          modelDir,
          '--output-dir',
          outputDir,
          '--seq-len',
          '256',
          '--max-steps',
          String(steps),
          '--async-level',
          String(k),
          ...args,
          '--ckpt.interval',
          '1000',
          '--orchestrator.batch-size',
          '32',
          '--orchestrator.rollouts-per-example',
          '8',
          '--orchestrator.sampling.max-tokens',
          maxTokens,
          '--orchestrator.base-urls',
          `${inference.url}/v1`,
          '--trainer.optim.lr',
          lr,
          '--trainer.threads',
          '1',
        ],
        env: {},
        shared: { keys: RL_SHARED_KEYS, sections: RL_SECTIONS },
      }).config;
      const q = taskQueues(cfg.temporal.task_queue);
      const cpu = await Worker.create({
        connection,
        taskQueue: q.cpu,
        workflowsPath: require.resolve('../workflows'),
        activities: createCpuActivities({ pool }),
      });
      const trainer = await Worker.create({
        connection,
        taskQueue: q.trainer,
        activities: createTrainerActivities(),
        maxConcurrentActivityTaskExecutions: 1,
      });
      const t0 = Date.now();
      await cpu.runUntil(
        trainer.runUntil(client.workflow.execute('rl', { taskQueue: q.cpu, workflowId: cfg.run_name, args: [cfg] })),
      );
      const wall = (Date.now() - t0) / 1000;
      const lines = readStepMetrics(RunLayout.of(outputDir, cfg.run_name).metricsFile);
      const times = lines.map((l) => l.time as Times);
      const stepTimes = times.slice(1).map((t, i) => t.train_end - times[i].train_end);
      const gen = times.map((t) => t.generate_end - t.generate_start);
      const train = times.map((t) => t.train_end - t.train_start);
      const overhead = lines.map((l, i) => {
        const t = times[i];
        const s = l.seconds as { load: number; replay: number; train: number; save: number };
        const observed = t.generate_end - t.generate_start + (t.train_end - t.train_start);
        const own = (l.generate_seconds as number) + s.load + s.replay + s.train + s.save;
        return observed - own;
      });
      if (modes) {
        // Trainer idle: the gaps between one train step's end and the next one's start.
        const idle = times.slice(1).reduce((a, t, i) => a + (t.train_start - times[i].train_end), 0);
        const busy = times[times.length - 1].train_end - times[0].train_start;
        // --curve-env ID: the curve follows that env's rollouts alone (a batch's env mix varies in flight).
        const layout = RunLayout.of(outputDir, cfg.run_name);
        // A step with none of that env's rollouts (in flight a batch can hold only the other env's) has no point: NaN.
        const rewardOf = (l: (typeof lines)[number], step: number) => {
          if (!curveEnv) return l.reward_mean as number;
          const rewards = readRollouts(layout.rolloutsDir(step))
            .filter((r) => r.env === curveEnv)
            .map((r) => r.reward);
          return rewards.length ? mean(rewards) : NaN;
        };
        const points = lines.map((l, i) => ({ reward: rewardOf(l, i), at: times[i].train_end - t0 / 1000 }));
        // The first env's share of each batch (strict mode keeps the mix's; in flight the claims keep it too).
        const firstEnv = (JSON.parse(envs) as { id: string }[])[0].id;
        const shares = lines.map((_, step) => {
          const rs = readRollouts(layout.rolloutsDir(step));
          return rs.filter((r) => r.env === firstEnv).length / Math.max(1, rs.length);
        });
        const inFlightMean = (key: string) => {
          const xs = lines.map((l) => l[key]).filter((x): x is number => typeof x === 'number');
          return xs.length ? mean(xs).toFixed(2) : '-';
        };
        curves.push({ name, points });
        const rewards = points.map((p) => `${Number.isNaN(p.reward) ? '-' : p.reward.toFixed(2)}@${p.at.toFixed(0)}s`);
        rows.push(
          `| ${name} | ${mean(stepTimes).toFixed(2)} | ${mean(gen).toFixed(2)} | ${mean(train).toFixed(2)} | ${(idle / busy).toFixed(2)} | ${wall.toFixed(1)} | ${Math.min(...shares).toFixed(2)}-${Math.max(...shares).toFixed(2)} | ${inFlightMean('inflight_concurrency')} | ${inFlightMean('deferred_groups')} | ${inFlightMean('off_policy_mean')} | ${rewards.join(' ')} |`,
        );
        process.stderr.write(`${rows[rows.length - 1]}\n`);
        continue;
      }
      rows.push(
        `| ${k} | ${mean(stepTimes).toFixed(2)} | ${mean(gen).toFixed(2)} | ${mean(train).toFixed(2)} | ${Math.max(mean(gen), mean(train)).toFixed(2)} | ${(mean(overhead) * 1000).toFixed(0)} | ${wall.toFixed(1)} |`,
      );
      process.stderr.write(`${rows[rows.length - 1]}\n`);
    }
  } finally {
    await client.connection.close();
    await connection.close();
    await pool.close();
    await inference.close(1000);
    await temporal.stop();
    fs.rmSync(root, { recursive: true, force: true });
  }
  if (modes) {
    process.stdout.write(
      [
        `Model: ${modelText}; ${steps} steps of 32 rollouts (4 prompts x 8), max ${maxTokens} new tokens per turn, lr ${lr}; envs ${envs}; ${os.cpus().length} cores.`,
        '',
        "| mode | step time (s) | generation / claim (s) | training (s) | trainer idle fraction | run wall time (s) | first env's share of a batch (min-max) | in-flight concurrency (groups, mean) | groups left over per step (mean) | off-policy mean | reward_mean @ time since start, per step |",
        '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |',
        ...rows,
        '',
        `Reward curves${curveEnv ? ` of the ${curveEnv} rollouts` : ''}:`,
        '',
        ...rewardCurves(curves, Number(arg('window', '10')), Number(arg('every', '60'))),
      ].join('\n'),
    );
    return;
  }
  process.stdout.write(
    [
      `Model: ${modelText}; ${steps} steps of 32 rollouts (4 prompts x 8), max ${maxTokens} new tokens, lr ${lr}; envs ${envs}; ${os.cpus().length} cores.`,
      '',
      '| async_level | step time (s) | generation (s) | training (s) | max(gen, train) (s) | Temporal overhead per step (ms) | run wall time (s) |',
      '| ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
      ...rows,
      '',
    ].join('\n'),
  );
}

/**
 * The modes' reward curves as two tables: at equal steps (mean reward of each window of `window`
 * steps) and at equal wall time (mean reward of the last `window` steps trained by each multiple
 * of `every` seconds since the run's start).
 */
function rewardCurves(
  curves: { name: string; points: { reward: number; at: number }[] }[],
  window: number,
  every: number,
) {
  // Steps without a point (NaN) are left out of a window's mean.
  const cell = (all: number[]) => {
    const xs = all.filter((x) => !Number.isNaN(x));
    return xs.length ? mean(xs).toFixed(3) : '-';
  };
  const steps = Math.max(...curves.map((c) => c.points.length));
  const windows = Array.from({ length: Math.ceil(steps / window) }, (_, w) => w * window);
  const end = Math.max(...curves.map((c) => c.points[c.points.length - 1]?.at ?? 0));
  const marks = Array.from({ length: Math.max(1, Math.ceil(end / every)) }, (_, i) => (i + 1) * every);
  const header = (cols: string[]) => [`| mode | ${cols.join(' | ')} |`, `| --- |${cols.map(() => ' ---: |').join('')}`];
  return [
    `Mean reward by steps (windows of ${window}):`,
    '',
    ...header(windows.map((w) => `steps ${w}-${Math.min(w + window, steps) - 1}`)),
    ...curves.map(
      (c) =>
        `| ${c.name} | ${windows.map((w) => cell(c.points.slice(w, w + window).map((p) => p.reward))).join(' | ')} |`,
    ),
    '',
    `Mean reward of the last ${window} steps trained by each time since the start (steps done in brackets):`,
    '',
    ...header(marks.map((m) => `${m} s`)),
    ...curves.map((c) => {
      const cells = marks.map((m) => {
        const done = c.points.filter((p) => p.at <= m);
        return `${cell(done.slice(-window).map((p) => p.reward))} (${done.length})`;
      });
      return `| ${c.name} | ${cells.join(' | ')} |`;
    }),
    '',
  ];
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack}\n`);
  process.exit(1);
});
