/**
 * The local launcher (`prime-rl sft|rl|eval`). It shares its Temporal dev server: a second command
 * finds the first one's server listening and runs on it; the first, when it ends, must not take the
 * server from under the second. And its processes die with it: a SIGKILLed launcher leaves no
 * inference server or worker behind, and the same command resumes the run even when a process of
 * the killed launcher lingers.
 */
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { sftSchema, type SFTConfig } from '../lib/config/schemas';
import { RunLayout } from '../lib/runfolder/layout';
import { freePort } from '../lib/net';
import { projectRoot } from '../lib/paths';
import { isListening, runningDevServer } from '../lib/temporal/devserver';
import { processId, processState } from '../lib/proc';
import {
  launchRun,
  launchSft,
  type EvalResultView,
  type RlProgressView,
  type RlResultView,
  type SftProgressView,
  type SftResultView,
} from '../lib/launch';
import type { EvalResult } from '../workflows/eval';
import type { RLProgress, RLResult } from '../workflows/rl';
import type { SftProgress, SftResult } from '../workflows/sft';
import { childrenOf, cmdline, isRunning, metricSteps, until } from './support/processes';
import { chaosScene, tinyRunArgs } from './support/rl-chaos';
import { cliConfig, namedRunArgs, oneThreadEach, reverseTextSft, rlConfig, smallStep } from './support/setup';

jest.setTimeout(5 * 60_000);

/**
 * Checked by tsc: the launcher (lib/launch, which may not import workflows/) reads the workflows'
 * progress and results through views of them; each workflow type must fit its view.
 */
type Fits<T extends View, View> = T;
export type WorkflowsFitLauncherViews = [
  Fits<RLProgress, RlProgressView>,
  Fits<RLResult, RlResultView>,
  Fits<SftProgress, SftProgressView>,
  Fits<SftResult, SftResultView>,
  Fits<EvalResult, EvalResultView>,
];

const { modelDir, outputDir, cli } = chaosScene('prime-launcher-');

/** Stops a dev server a test's launcher started (left running for other commands). */
function stopServer(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(pid, 'SIGTERM');
  } catch {
    // already gone
  }
}

test('a command that started the dev server leaves it running for another command still using it', async () => {
  const [port, uiPort] = [await freePort(), await freePort()];
  const sft = (name: string, steps: number): SFTConfig =>
    cliConfig(sftSchema, [
      ...namedRunArgs(name, modelDir, outputDir),
      '--threads',
      '1',
      '--max-steps',
      String(steps),
      ...reverseTextSft(4, 16),
      '--temporal.port',
      String(port),
      '--temporal.ui-port',
      String(uiPort),
      '--temporal.task-queue',
      name,
    ]);

  const first = await launchSft(sft('first', 2), { quiet: true });
  let serverPid: number | undefined;
  try {
    serverPid = first.processes.temporal.pid;
    expect(serverPid).toBeDefined();
    expect((await first.result).steps).toBe(2);

    const second = await launchSft(sft('second', 6), { quiet: true });
    try {
      expect(second.processes.temporal.pid).toBeUndefined(); // it found the first one's server
      await first.stop();
      expect(await isListening('127.0.0.1', port)).toBe(true);
      // Recorded for `prime-rl temporal stop`, with no launcher looking after it any more.
      expect(runningDevServer(outputDir)).toMatchObject({ pid: serverPid, port });
      expect(runningDevServer(outputDir)?.owner).toBeUndefined();
      expect((await second.result).steps).toBe(6);
    } finally {
      await second.stop();
    }
  } finally {
    await first.stop();
    stopServer(serverPid);
  }
});

test('SIGKILL of the launcher takes its processes with it, and the same command resumes past a lingering one', async () => {
  const steps = 10;
  const [port, uiPort, http] = [await freePort(), await freePort(), await freePort()];
  const args = [
    'rl',
    ...namedRunArgs('orphans', modelDir, outputDir),
    '--max-steps',
    String(steps),
    '--env',
    '[{"id": "reverse-text"}]',
    ...smallStep(12),
    ...oneThreadEach,
    '--temporal.port',
    String(port),
    '--temporal.ui-port',
    String(uiPort),
    '--temporal.task-queue',
    'orphans',
    '--temporal.heartbeat-timeout-s',
    '8',
    '--inference.server.port',
    String(http),
    '--orchestrator.base-urls',
    `http://127.0.0.1:${http}/v1`,
  ];
  const metrics = RunLayout.of(outputDir, 'orphans').metricsFile;
  /** The launcher's own children: inference server and workers (the Temporal dev server may outlive it, for other commands). */
  const ownChildren = (pid: number) => childrenOf(pid).filter((c) => cmdline(c).includes('prime-rl.js'));

  // 1. Killed mid-run: its inference server and workers exit by themselves.
  const first = cli.start(args);
  await until('step 0 of the first launch', () => metricSteps(metrics).length > 0);
  const devServer = childrenOf(first.child.pid!).find((c) => cmdline(c).includes('start-dev'));
  if (devServer !== undefined) cli.track(devServer);
  const orphans = ownChildren(first.child.pid!);
  expect(orphans.map((p) => cmdline(p).split(' ')[2]).sort()).toEqual(['inference', 'worker', 'worker']);
  first.child.kill('SIGKILL');
  await until(
    `the killed launcher's processes ${orphans.map((p) => `${p} (${cmdline(p)})`).join(', ')} to exit`,
    () => !orphans.some(isRunning),
    60_000,
  );

  // 2. Killed again, now with its inference server frozen (SIGSTOP): it cannot notice, still holds
  // its port, and must be found and stopped by the next launch of the same command.
  const second = cli.start(args);
  const done = metricSteps(metrics).length;
  await until('a step trained by the second launch', () => metricSteps(metrics).length > done);
  const [inference] = ownChildren(second.child.pid!).filter((p) => cmdline(p).includes(' inference '));
  expect(inference).toBeDefined();
  process.kill(inference, 'SIGSTOP');
  // The run waits for it; the progress line names the silent server (it only grew its ETA before).
  const silent = new RegExp(
    `inference server silent \\(stopped, hung or unreachable\\): http://127\\.0\\.0\\.1:${http} for \\d+s`,
  );
  await until('the progress line to name the silent server', () => silent.test(second.output()), 60_000);
  second.child.kill('SIGKILL');
  await second.exited;
  // And a recorded pid that now belongs to another process (pids are recycled) is never signalled:
  // the record says the trainer is this `sleep`, with the trainer's start time.
  const stranger = spawn('sleep', ['600'], { stdio: 'ignore', detached: true });
  cli.track(stranger.pid!);
  const launcherFile = RunLayout.of(outputDir, 'orphans').launcherFile;
  const record = JSON.parse(fs.readFileSync(launcherFile, 'utf8')) as {
    processes: Record<string, { pid: number; start: string }>;
  };
  record.processes.trainer.pid = stranger.pid!;
  fs.writeFileSync(launcherFile, JSON.stringify(record));

  const third = cli.start(args);
  expect(await third.exited).toBe(0);
  expect(third.output()).toContain(`run orphans completed: ${steps} steps`);
  expect(third.output()).not.toContain('already in use');
  expect(isRunning(inference)).toBe(false);
  expect(isRunning(stranger.pid!)).toBe(true);
  expect(fs.existsSync(launcherFile)).toBe(false);
  expect(metricSteps(metrics)).toEqual(Array.from({ length: steps }, (_, i) => i));
});

test("a re-run stops the killed launcher's inference server while its last thread still holds the port", async () => {
  // The state a killed launcher's server can be in for a while (a large process exiting): its main
  // thread a zombie, a thread left that keeps the port bound (test/fixtures/zombie-leader.py). The
  // re-run took it for gone and refused the port (issue #42); it must stop it and wait for the port.
  const config = rlConfig(await tinyRunArgs({ name: 'lingering', modelDir, outputDir, steps: 2 }));
  const port = config.inference.server.port;
  const holder = spawn('python3', [path.join(__dirname, 'fixtures', 'zombie-leader.py'), String(port), '60'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  cli.track(holder.pid!);
  await new Promise((r) => holder.stdout.once('data', r));
  await until('its main thread to exit', () => processState(holder.pid!) === 'Z', 10_000);
  const layout = RunLayout.of(outputDir, 'lingering');
  fs.mkdirSync(layout.dir, { recursive: true });
  const dead = spawnSync(process.execPath, ['-e', '0']).pid;
  fs.writeFileSync(
    layout.launcherFile,
    JSON.stringify({ launcher: { pid: dead, start: '1' }, processes: { inference: processId(holder.pid) } }),
  );
  const run = await launchRun(config, { quiet: true });
  try {
    expect(isRunning(holder.pid!)).toBe(false);
    expect(fs.readFileSync(path.join(layout.logsDir, 'launcher.log'), 'utf8')).toContain(
      `stopping inference (pid ${holder.pid}), left running by the killed launcher ${dead} of this run`,
    );
    expect((await run.result).steps).toBe(2);
  } finally {
    await run.stop();
  }
});

test('the Temporal dev server of a killed launcher, left up for other commands, is stopped by `prime-rl temporal stop`', async () => {
  const [port, uiPort] = [await freePort(), await freePort()];
  const where = ['--output-dir', outputDir, '--temporal.port', String(port), '--temporal.ui-port', String(uiPort)];
  const launcher = cli.start([
    'sft',
    '--run-name',
    'left',
    '--model.name',
    modelDir,
    '--seq-len',
    '128',
    '--threads',
    '1',
    '--max-steps',
    '1000',
    ...reverseTextSft(4, 16),
    '--temporal.task-queue',
    'left',
    ...where,
  ]);
  await until(
    'the launcher to record its dev server',
    async () =>
      runningDevServer(outputDir)?.owner?.pid === launcher.child.pid && (await isListening('127.0.0.1', port)),
  );
  const server = runningDevServer(outputDir)!;
  cli.track(server.pid);
  const stop = () =>
    spawnSync(process.execPath, [path.join(projectRoot, 'bin', 'prime-rl.js'), 'temporal', 'stop', ...where], {
      encoding: 'utf8',
    });

  // While its launcher runs, the server is the launcher's to stop (it would restart it).
  const refused = stop();
  expect(refused.stderr).toBe(
    `error: the Temporal dev server (pid ${server.pid}) belongs to the running launcher pid ${launcher.child.pid}, which would restart it; stop that command instead\n`,
  );
  expect(refused.status).toBe(1);

  launcher.child.kill('SIGKILL');
  await launcher.exited;
  const stopped = stop();
  expect(stopped.stdout).toBe(`Temporal dev server (pid ${server.pid}) stopped.\n`);
  expect(stopped.status).toBe(0);
  expect(await isListening('127.0.0.1', port)).toBe(false);
});

test('inference.replicas (prime-rl data_parallel_size): rl starts that many servers on consecutive ports and samples from all', async () => {
  const { launchRun } = await import('../lib/launch/rl');
  const [port, temporalPort, uiPort] = [await freePort(), await freePort(), await freePort()];
  const config = rlConfig([
    ...['--run-name', 'replicas', '--model.name', modelDir, '--output-dir', outputDir, '--seq-len', '128'],
    ...['--max-steps', '1', '--env', '[{"id": "reverse-text"}]', '--trainer.threads', '1', '--inference.threads', '1'],
    ...['--orchestrator.batch-size', '8', '--orchestrator.rollouts-per-example', '2'],
    ...['--orchestrator.sampling.max-tokens', '8', '--inference.replicas', '2'],
    ...['--inference.server.port', String(port), '--temporal.port', String(temporalPort)],
    ...['--temporal.ui-port', String(uiPort), '--temporal.task-queue', 'replicas'],
  ]);
  expect(config.orchestrator.base_urls).toEqual([`http://127.0.0.1:${port}/v1`, `http://127.0.0.1:${port + 1}/v1`]);
  const run = await launchRun(config, { quiet: true });
  let serverPid: number | undefined;
  try {
    serverPid = run.processes.temporal.pid;
    expect((await run.result).steps).toBe(1);
    const logs = path.join(RunLayout.of(outputDir, 'replicas').dir, 'logs');
    for (const [file, p] of [
      ['inference.log', port],
      ['inference-1.log', port + 1],
    ] as const)
      expect(fs.readFileSync(path.join(logs, file), 'utf8')).toContain(`on http://127.0.0.1:${p}`);
  } finally {
    await run.stop();
    stopServer(serverPid);
  }
});
