/**
 * What the tests of runs under faults share (test/rl.recovery.test.ts, test/rl.inflight.test.ts,
 * test/rl.diskfull.test.ts): the `prime-rl rl` arguments of a tiny run on its own ports, the
 * processes a launcher records, and what every run must show at its end.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { freePort } from '../../lib/net';
import { asProcessId, isRunning, type ProcessId } from '../../lib/proc';
import type { RunLayout } from '../../lib/runfolder/layout';
import { runningDevServer } from '../../lib/temporal/devserver';
import { readBatch } from '../../lib/runfolder/batch';
import { CliProcesses, metricLines } from './processes';
import { namedRunArgs, oneThreadEach, removeDir, smallStep, tempDir, tinyModel } from './setup';

/**
 * `prime-rl rl` arguments of a tiny run (reverse-text, batch 8 = 2 groups of 4) on its own ports
 * (the local dev server's too, unless `temporal` names them) and its own task queues.
 */
export async function tinyRunArgs(o: {
  name: string;
  modelDir: string;
  outputDir: string;
  steps: number;
  temporal?: { port: number; uiPort: number; metricsPort: number };
  /** `temporal.heartbeat_timeout_s`, also the launcher's liveness deadline for its processes (5 s unless set). */
  heartbeatTimeoutS?: number;
}): Promise<string[]> {
  const http = await freePort();
  const { port, uiPort, metricsPort } = o.temporal ?? {
    port: await freePort(),
    uiPort: await freePort(),
    metricsPort: await freePort(),
  };
  return [
    ...namedRunArgs(o.name, o.modelDir, o.outputDir),
    '--max-steps',
    String(o.steps),
    '--async-level',
    '1',
    '--env',
    '[{"id": "reverse-text"}]',
    '--ckpt.interval',
    '2',
    '--temporal.port',
    String(port),
    '--temporal.ui-port',
    String(uiPort),
    '--temporal.metrics-port',
    String(metricsPort),
    '--temporal.heartbeat-timeout-s',
    String(o.heartbeatTimeoutS ?? 5),
    '--inference.server.port',
    String(http),
    '--orchestrator.base-urls',
    `http://127.0.0.1:${http}/v1`,
    ...smallStep(12),
    '--trainer.optim.lr',
    '1e-3',
    ...oneThreadEach,
    // A random model scores 0 everywhere: train those zero-advantage rollouts, so that every step trains samples.
    '--orchestrator.filter-zero-advantages',
    'false',
    // With every advantage 0, grpo's gradient is exactly 0, so each step samples the same tokens
    // whatever the timing. dppo's KL term would turn the last-bit noise of batch-dependent
    // inference logprobs into Adam updates, and later steps could sample other tokens.
    '--trainer.loss.type',
    'grpo',
  ];
}

/**
 * What every run must show after `steps` steps, whatever happened to it: each metrics line once,
 * the trainer's counters equal to the batches' (every step trained once), the final weights.
 */
export function checkRun(layout: RunLayout, steps: number) {
  const lines = metricLines(layout.metricsFile);
  expect(lines.map((l) => l.step)).toEqual(Array.from({ length: steps }, (_, i) => i));
  const batches = Array.from({ length: steps }, (_, s) => readBatch(layout.batchFile(s)).counts);
  const last = lines[steps - 1].progress as { steps: number; samples: number; tokens: number };
  expect(last.steps).toBe(steps);
  expect(last.samples).toBe(batches.reduce((a, c) => a + c.samples, 0));
  expect(last.tokens).toBe(batches.reduce((a, c) => a + c.tokens, 0));
  expect(fs.existsSync(path.join(layout.weightsDir(steps), 'model.safetensors'))).toBe(true);
  return last;
}

/** The processes the launcher records in `<run>/launcher.json` (the ones still running). */
export function recordedProcesses(layout: RunLayout): Record<string, ProcessId> {
  try {
    const raw = JSON.parse(fs.readFileSync(layout.launcherFile, 'utf8')) as { processes: Record<string, unknown> };
    const running = Object.entries(raw.processes).map(([k, v]) => [k, asProcessId(v)] as const);
    return Object.fromEntries(running.filter((e): e is [string, ProcessId] => e[1] !== undefined && isRunning(e[1])));
  } catch {
    return {}; // not written yet, or being replaced
  }
}

/**
 * A temp folder with a tiny model and an outputs folder, and the CLI processes a test starts there;
 * registers the jest hooks that make the model first and kill every process at the end (the Temporal
 * dev server included: it has its own process group) and remove the folder (unless KEEP_TMP).
 */
export function chaosScene(prefix: string): {
  root: string;
  modelDir: string;
  outputDir: string;
  cli: CliProcesses;
  stopAll: () => void;
} {
  const root = tempDir(prefix);
  const modelDir = path.join(root, 'model');
  const outputDir = path.join(root, 'outputs');
  const cli = new CliProcesses(path.join(root, 'cli'));
  const stopAll = () => {
    const server = runningDevServer(outputDir);
    if (server) cli.track(server.pid);
    cli.cleanup();
  };
  beforeAll(() => tinyModel(modelDir));
  afterAll(() => {
    stopAll();
    if (!process.env.KEEP_TMP) removeDir(root);
  });
  return { root, modelDir, outputDir, cli, stopAll };
}
