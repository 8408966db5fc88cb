/**
 * A run whose pieces are started by hand, as docs/cluster.md ("The pieces separately") shows and a
 * cluster's scheduler starts them: a dev server (`temporal start --detach`), an inference worker, a
 * cpu and a trainer worker that name their run (`--run-name`) and reach Temporal through
 * TEMPORAL_ADDRESS alone, the workflow input from `rl --dry-run FILE`, and `runs start`, which
 * starts the workflow and follows it to its end without starting anything. Then what a person
 * watching the run sees: each worker's Temporal SDK metrics on its Prometheus endpoint
 * (`--metrics-address`), labelled with the run's task queues, and each activity's start and end in
 * the worker's log at info with its run, step and attempt.
 */
import * as path from 'node:path';
import { freePort } from '../lib/net';
import { projectRoot } from '../lib/paths';
import { RunLayout } from '../lib/runfolder/layout';
import type { CliLaunch } from './support/processes';
import { until } from './support/processes';
import { chaosScene, checkRun } from './support/rl-chaos';

jest.setTimeout(5 * 60_000);

const { root, modelDir, outputDir, cli } = chaosScene('prime-pieces-');
const RUN = 'pieces';

test('the pieces by hand: workers named by run, the workflow from runs start; SDK metrics and activity logs to watch it by', async () => {
  const [port, uiPort, serverMetrics, http, cpuMetrics, trainerMetrics] = await Promise.all(
    Array.from({ length: 6 }, () => freePort()),
  );
  const env = ['env', `TEMPORAL_ADDRESS=127.0.0.1:${port}`];
  const run = (args: string[]) => cli.start(args, env);
  const exits = async (launch: CliLaunch) => ({ code: await launch.exited, output: launch.output() });

  const dev = await exits(
    cli.start([
      ...['temporal', 'start', '--detach', '--output-dir', path.join(root, 'temporal')],
      ...['--temporal.port', String(port), '--temporal.ui-port', String(uiPort)],
      ...['--temporal.metrics-port', String(serverMetrics)],
    ]),
  );
  expect(dev.code).toBe(0);
  cli.track(Number(/Detached \(pid (\d+)\)/.exec(dev.output)![1]));

  run([
    ...['worker', '--pool', 'inference', '--output-dir', outputDir, '--inference.model.name', modelDir],
    ...['--inference.server.port', String(http), '--inference.seq-len', '128', '--inference.threads', '1'],
  ]);
  const cpu = run([
    ...['worker', '--pool', 'cpu', '--run-name', RUN, '--env-workers', '1'],
    ...['--metrics-address', `127.0.0.1:${cpuMetrics}`],
  ]);
  const trainer = run([
    ...['worker', '--pool', 'trainer', '--run-name', RUN, '--threads', '1'],
    ...['--metrics-address', `127.0.0.1:${trainerMetrics}`],
  ]);

  const resolved = path.join(root, 'resolved.json');
  const dry = await exits(
    run([
      ...['rl', '@', path.join(projectRoot, 'configs/debug/rl.toml'), '--model.name', modelDir],
      ...['--output-dir', outputDir, '--run-name', RUN, '--max-steps', '2', '--seq-len', '128'],
      ...['--orchestrator.batch-size', '8', '--orchestrator.sampling.max-tokens', '12'],
      ...['--orchestrator.base-urls', `http://127.0.0.1:${http}/v1`, '--trainer.threads', '1'],
      ...['--dry-run', resolved],
    ]),
  );
  expect(dry.code).toBe(0);
  expect(dry.output).toContain(`"task_queue": "prime-rl.${RUN}"`);

  const started = await exits(run(['runs', 'start', resolved, '--kind', 'rl']));
  expect(started.output).toContain(`run ${RUN} completed: 2 steps`);
  expect(started.output).not.toContain('Temporal dev server on'); // it started nothing
  expect(started.code).toBe(0);
  checkRun(RunLayout.of(outputDir, RUN), 2);

  // Each worker's SDK metrics, by the run's task queue and activity type.
  const series = async (p: number, metric: string) =>
    (await (await fetch(`http://127.0.0.1:${p}/metrics`)).text())
      .split('\n')
      .filter((l) => l.startsWith(`${metric}`) && l.includes('{'));
  const has = (lines: string[], ...labels: string[]) => lines.some((l) => labels.every((x) => l.includes(x)));
  const cpuLatency = await series(cpuMetrics, 'temporal_activity_execution_latency');
  expect(has(cpuLatency, 'activity_type="generateRollouts"', `task_queue="prime-rl.${RUN}.cpu"`)).toBe(true);
  expect(has(await series(cpuMetrics, 'temporal_workflow_completed'), 'workflow_type="rl"')).toBe(true);
  const trainerLatency = await series(trainerMetrics, 'temporal_activity_execution_latency');
  expect(has(trainerLatency, 'activity_type="trainStep"', `task_queue="prime-rl.${RUN}.trainer"`)).toBe(true);

  // Each activity at info in its worker's log: run, step, attempt; its end and duration.
  await until('the workers logged', () =>
    /trainStep run pieces step 1 attempt 1: done in [\d.]+ s/.test(trainer.output()),
  );
  expect(cpu.output()).toMatch(/\[INFO\] generateRollouts run pieces step 0 attempt 1: started/);
  expect(cpu.output()).toMatch(/\[INFO\] packBatch run pieces step 1 attempt 1: done in [\d.]+ s/);
  // The workflows came from the bundle `npm run build:ts` left in dist/ (workers/bundle.ts), not webpack.
  expect(cpu.output()).not.toContain('workflow bundle not used');
  expect(cpu.output()).toMatch(
    `worker cpu polling prime-rl.${RUN}.cpu on 127.0.0.1:${port} (namespace default, plain gRPC; from TEMPORAL_ADDRESS); metrics at http://127.0.0.1:${cpuMetrics}/metrics`,
  );
});
