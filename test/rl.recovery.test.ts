/**
 * Recovery, tested: a real run launched as `prime-rl rl` launches it (Temporal dev server,
 * inference server, cpu and trainer workers as processes), with each of them SIGKILLed at a
 * different point. The launcher restarts what it owns; the run must complete with every step
 * trained exactly once, no lost or duplicated metrics lines, and the final weights present.
 */
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { loadConfig } from '../lib/config/loader';
import { RL_SECTIONS, RL_SHARED_KEYS, rlSchema, type RLConfig } from '../lib/config/schemas';
import { createModel } from '../lib/model/create';
import { readBatch } from '../lib/orchestrator/batch';
import { RunLayout } from '../lib/run/layout';
import { readStepMetrics } from '../lib/run/metrics';
import { launchRun } from '../workers/launcher';
import { freePort } from '../lib/net';

jest.setTimeout(15 * 60_000);


const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-recovery-'));
const modelDir = path.join(root, 'model');
const STEPS = 6;

beforeAll(() => createModel({ arch: 'qwen3', preset: 'tiny', tokenizer: 'bytes', seed: 0, out: modelDir }));
afterAll(() => process.env.KEEP_TMP || fs.rmSync(root, { recursive: true, force: true }));

async function runConfig(name: string): Promise<RLConfig> {
  const [port, uiPort, http] = [await freePort(), await freePort(), await freePort()];
  return loadConfig({
    schema: rlSchema,
    argv: [
      '--run-name', name, '--model.name', modelDir, '--output-dir', path.join(root, 'outputs'),
      '--seq-len', '128', '--max-steps', String(STEPS), '--async-level', '1',
      '--env', '[{"id": "reverse-text"}]', '--ckpt.interval', '2',
      '--temporal.port', String(port), '--temporal.ui-port', String(uiPort), '--temporal.heartbeat-timeout-s', '8',
      '--temporal.task-queue', name,
      '--inference.server.port', String(http), '--orchestrator.base-urls', `http://127.0.0.1:${http}/v1`,
      '--orchestrator.batch-size', '8', '--orchestrator.rollouts-per-example', '4', '--orchestrator.sampling.max-tokens', '12',
      '--orchestrator.env-workers', '1', '--trainer.optim.lr', '1e-3', '--trainer.threads', '1', '--inference.threads', '1',
    ],
    env: {},
    shared: { keys: RL_SHARED_KEYS, sections: RL_SECTIONS },
  }).config;
}

/** Resolves when the run's metrics file has a line for `step`. */
async function stepRecorded(layout: RunLayout, step: number): Promise<void> {
  while (!readStepMetrics(layout.metricsFile).some((l) => l.step === step)) await new Promise((r) => setTimeout(r, 200));
}

/** What every run must show: each step once, counters equal to the batches, final weights. */
function checkRun(layout: RunLayout) {
  const lines = readStepMetrics(layout.metricsFile);
  expect(lines.map((l) => l.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i));
  const batches = Array.from({ length: STEPS }, (_, s) => readBatch(layout.batchFile(s)).counts);
  const last = lines[STEPS - 1].progress as { steps: number; samples: number; tokens: number };
  expect(last.steps).toBe(STEPS);
  expect(last.samples).toBe(batches.reduce((a, c) => a + c.samples, 0));
  expect(last.tokens).toBe(batches.reduce((a, c) => a + c.tokens, 0));
  expect(fs.existsSync(path.join(layout.weightsDir(STEPS), 'model.safetensors'))).toBe(true);
  return last;
}

test('an uninterrupted run and one whose every process is SIGKILLed end with the same trainer counters', async () => {
  const calm = await launchRun(await runConfig('calm'), { quiet: true });
  try {
    expect((await calm.result).steps).toBe(STEPS);
  } finally {
    await calm.stop();
  }
  const expected = checkRun(calm.layout);

  const config = await runConfig('killed');
  const run = await launchRun(config, { quiet: true });
  try {
    // The same run name in another output dir is another run: refused, never attached to this one.
    await expect(launchRun({ ...config, output_dir: path.join(root, 'elsewhere') }, { quiet: true })).rejects.toThrow(
      `workflow killed is running for run folder ${path.resolve(run.layout.dir)}, not ${path.join(root, 'elsewhere', 'killed')}: use another run_name`,
    );
    const kill = (name: keyof typeof run.processes) => {
      const pid = run.processes[name].pid;
      if (pid === undefined) throw new Error(`${name} has no pid`);
      process.kill(pid, 'SIGKILL');
    };
    await stepRecorded(run.layout, 0);
    kill('trainer');
    await stepRecorded(run.layout, 1);
    kill('inference');
    await stepRecorded(run.layout, 2);
    kill('cpu');
    await stepRecorded(run.layout, 3);
    kill('temporal');
    // Every process the launcher owns comes back (the launcher notices each death and restarts it).
    const names = ['trainer', 'inference', 'cpu', 'temporal'] as const;
    while (names.some((p) => run.processes[p].restarts < 1)) await new Promise((r) => setTimeout(r, 100));
    const result = await run.result;
    expect(result.steps).toBe(STEPS);
  } finally {
    await run.stop();
  }
  expect(checkRun(run.layout)).toEqual(expected);
});

test('a port taken by another process is refused before anything starts, never shared', async () => {
  const other = net.createServer().listen(0, '127.0.0.1');
  await new Promise((r) => other.once('listening', r));
  const { port } = other.address() as net.AddressInfo;
  try {
    const config = await runConfig('taken');
    await expect(launchRun({ ...config, inference: { ...config.inference, server: { ...config.inference.server, port } } }, { quiet: true })).rejects.toThrow(
      `inference.server.port: 127.0.0.1:${port} is already in use`,
    );
  } finally {
    other.close();
  }
});
