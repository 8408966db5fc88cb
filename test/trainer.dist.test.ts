/**
 * The data-parallel trainer as users run it: `prime-rl rl` / `sft` with `trainer.world_size = 2`
 * start two trainer ranks (one core each) that train every step together. Their weights equal
 * those of world size 1 on the same batches (here: one trainer replaying the run's stored batches),
 * SIGKILLed ranks cost a retry on a fresh process group and never a step applied twice, and bad
 * settings exit 2 naming the key.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { loadConfig } from '../lib/config/loader';
import { sftSchema, trainerRankSchema } from '../lib/config/schemas';
import { launchRun, launchSft, type LocalRun } from '../lib/launch';
import { loadHfModel } from '../lib/model/hf';
import { decode } from '../lib/model/testing';
import { freePort } from '../lib/net';
import { readBatch } from '../lib/runfolder/batch';
import { projectRoot } from '../lib/paths';
import { RunLayout } from '../lib/runfolder/layout';
import { runningDevServer } from '../lib/temporal/devserver';
import { GroupLeader, runFollower } from '../lib/trainer/group';
import { RankTrainer } from '../lib/trainer/ranks';
import * as native from '../native';
import { CliProcesses, metricLines, until } from './support/processes';
import { oneThreadEach, rlConfig, smallStep, tinyModel } from './support/setup';

jest.setTimeout(8 * 60_000);
native.setThreads(1);

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-dist-'));
const modelDir = path.join(root, 'model');
const outputDir = path.join(root, 'outputs');
const cli = new CliProcesses(path.join(root, 'cli'));

beforeAll(() => tinyModel(modelDir));
afterAll(() => {
  const server = runningDevServer(outputDir);
  if (server) cli.track(server.pid);
  cli.cleanup();
  if (!process.env.KEEP_TMP) fs.rmSync(root, { recursive: true, force: true });
});

/** Keys both commands share: their own Temporal ports and queue, `worldSize` ranks, short timeouts. */
async function common(name: string, worldSize = 2, ports?: [number, number]): Promise<string[]> {
  const [port, uiPort] = ports ?? [await freePort(), await freePort()];
  return [
    ...['--run-name', name, '--model.name', modelDir, '--output-dir', outputDir, '--seq-len', '128'],
    ...['--temporal.port', String(port), '--temporal.ui-port', String(uiPort), '--temporal.task-queue', name],
    ...['--temporal.heartbeat-timeout-s', '5', '--trainer.world-size', String(worldSize)],
    ...['--trainer.dist.timeout-s', '10'],
  ];
}

/**
 * The final weights of `run` against one trainer (world size 1) replaying the run's stored batches
 * from the base model: equal up to fp32 reduction order. Adam turns the last-bit differences of
 * small gradients into differences up to a fraction of `lr` on a few weights (RL: 2% of them above
 * 1e-5 after 8 steps, the worst 1.7e-4 at lr 1e-3); a step applied twice or skipped moves most
 * weights by about lr, and the mean by far more than lr / 100.
 */
async function expectSameAsOneTrainer(run: LocalRun<unknown>, steps: number, lr: number): Promise<void> {
  const copy = path.join(root, `${path.basename(run.layout.dir)}-ws1`);
  fs.cpSync(run.layout.dir, copy, { recursive: true });
  const layout = new RunLayout(copy);
  for (const d of [layout.checkpointsRoot, layout.weightsRoot]) fs.rmSync(d, { recursive: true, force: true });
  const rt = await new RankTrainer().at(copy, steps);
  const ws1 = loadHfModel(await rt.writeWeights(steps)).tensors;
  const ws2 = loadHfModel(run.layout.weightsDir(steps)).tensors;
  expect(ws2.map((t) => t.name)).toEqual(ws1.map((t) => t.name));
  let worst = 0,
    moved = 0,
    sum = 0,
    count = 0;
  const base = loadHfModel(modelDir).tensors;
  ws1.forEach((t, i) => {
    const a = decode(t),
      b = decode(ws2[i]),
      b0 = decode(base.find((x) => x.name === t.name)!);
    for (let k = 0; k < a.length; k++) {
      worst = Math.max(worst, Math.abs(a[k] - b[k]));
      sum += Math.abs(a[k] - b[k]);
      count++;
      moved = Math.max(moved, Math.abs(a[k] - b0[k]));
    }
  });
  expect(moved).toBeGreaterThan(2 * lr); // training changed the weights ...
  expect(worst).toBeLessThan(lr / 4); // ... the same way at both world sizes
  expect(sum / count).toBeLessThan(lr / 100);
}

/** Every step trained once: one metrics line each, counters equal to the batches. */
function expectEachStepOnce(layout: RunLayout, steps: number): void {
  const lines = metricLines(layout.metricsFile);
  expect(lines.map((l) => l.step)).toEqual(Array.from({ length: steps }, (_, i) => i));
  const batches = Array.from({ length: steps }, (_, s) => readBatch(layout.batchFile(s)).counts);
  const last = lines[steps - 1].progress as { steps: number; samples: number; tokens: number };
  expect(last).toEqual({
    steps,
    samples: batches.reduce((a, c) => a + c.samples, 0),
    tokens: batches.reduce((a, c) => a + c.tokens, 0),
  });
}

test('rl at world size 2 == world size 1; SIGKILLed ranks mid-run cost a retry, never a step twice', async () => {
  const STEPS = 8;
  const [http] = [await freePort()];
  const argv = [
    ...(await common('dist-rl')),
    ...['--max-steps', String(STEPS), '--async-level', '1', '--ckpt.interval', '2'],
    ...['--env', '[{"id": "reverse-text"}]'],
    ...['--inference.server.port', String(http), '--orchestrator.base-urls', `http://127.0.0.1:${http}/v1`],
    ...smallStep(12),
    ...oneThreadEach,
    ...['--trainer.optim.lr', '1e-3', '--orchestrator.filter-zero-advantages', 'false'],
  ];
  const config = rlConfig(argv);
  const run = await launchRun(config, { quiet: true });
  try {
    const trained = (s: number) => fs.existsSync(run.layout.trainSummaryFile(s));
    // Rank 1 while step 2 trains (its collectives with rank 0 break), then rank 0 (the Temporal
    // worker, which also serves the store) while step 5 trains.
    await until('step 1 trained', () => trained(1));
    await until('step 2 training', () => fs.existsSync(run.layout.batchFile(2)));
    process.kill(run.followers[0].pid!, 'SIGKILL');
    await until('step 4 trained', () => trained(4));
    await until('step 5 training', () => fs.existsSync(run.layout.batchFile(5)));
    process.kill(run.processes.trainer.pid!, 'SIGKILL');
    const result = (await run.result) as { steps: number };
    expect(result.steps).toBe(STEPS);
    expect(run.followers[0].restarts).toBeGreaterThanOrEqual(1);
    expect(run.processes.trainer.restarts).toBeGreaterThanOrEqual(1);
  } finally {
    await run.stop();
  }
  expectEachStepOnce(run.layout, STEPS);
  // Rank 0 alone wrote: one checkpoint per interval, no temp leftovers of another rank.
  expect(fs.readdirSync(run.layout.checkpointsRoot).sort()).toEqual(['step_2', 'step_4', 'step_6', 'step_8']);
  await expectSameAsOneTrainer(run, STEPS, 1e-3);
});

test('sft at world size 2 == world size 1 on the same batches', async () => {
  const STEPS = 4;
  const argv = [
    ...(await common('dist-sft')),
    ...['--threads', '1', '--max-steps', String(STEPS), '--batch-size', '8', '--optim.lr', '1e-3'],
    ...['--data.env', '{"id": "reverse-text"}', '--data.num-examples', '32'],
  ];
  const run = await launchSft(loadConfig({ schema: sftSchema, argv, env: {} }).config, { quiet: true });
  try {
    expect(((await run.result) as { steps: number }).steps).toBe(STEPS);
  } finally {
    await run.stop();
  }
  await expectSameAsOneTrainer(run, STEPS, 1e-3);
});

test('sft at world size 4, fully sharded: a SIGKILLed rank mid-step, a sharded checkpoint resumed at world size 2, == world size 1', async () => {
  const STEPS = 6;
  const ports: [number, number] = [await freePort(), await freePort()];
  // The same run and Temporal server, launched at world size 4, then again at 2.
  const configAt = async (worldSize: number) => {
    const argv = [
      ...(await common('dist-fsdp', worldSize, ports)),
      ...['--trainer.dist.sharding', 'full', '--threads', '1', '--max-steps', String(STEPS), '--batch-size', '8'],
      ...['--optim.lr', '1e-3', '--ckpt.interval', '2', '--data.env', '{"id": "reverse-text"}'],
      ...['--data.num-examples', '48'],
    ];
    return loadConfig({ schema: sftSchema, argv, env: {} }).config;
  };
  const run = await launchSft(await configAt(4), { quiet: true });
  const trained = (s: number) => fs.existsSync(run.layout.trainSummaryFile(s));
  try {
    // Rank 2 while step 2 trains (the next starts as soon as step 1 is done): the step is retried
    // on a new group, every rank restoring from the sharded checkpoint of step 2.
    await until('step 1 trained', () => trained(1));
    process.kill(run.followers[1].pid!, 'SIGKILL');
    await until('checkpoint 4', () => fs.existsSync(run.layout.checkpointDir(4)), 240_000);
    expect(run.followers[1].restarts).toBeGreaterThanOrEqual(1);
  } finally {
    await run.stop(); // the workflow goes on; the next launch re-attaches to it
  }
  const again = await launchSft(await configAt(2), { quiet: true });
  try {
    expect(((await again.result) as { steps: number }).steps).toBe(STEPS);
  } finally {
    await again.stop();
  }
  // Written by four ranks, then by two: each rank's shard beside the index.
  const shards = (step: number) =>
    fs.readdirSync(run.layout.checkpointDir(step)).filter((f) => f.startsWith('shard-')).length;
  expect([2, 4, 6].map(shards)).toEqual([4, 4, 2]);
  // Every restore loaded its checkpoint (none was skipped for a replay from the base model).
  const logs = fs.readdirSync(run.layout.logsDir).map((f) => fs.readFileSync(path.join(run.layout.logsDir, f), 'utf8'));
  expect(logs.join('\n')).not.toContain('unusable checkpoint');
  await expectSameAsOneTrainer(again, STEPS, 1e-3);
});

test("a follower whose trainer.dist.sharding differs from rank 0's refuses to join, naming the key", async () => {
  const port = await freePort();
  const leaderConfig = trainerRankSchema.parse({ world_size: 2, dist: { port, timeout_s: 5, sharding: 'full' } });
  const leader = await GroupLeader.start(leaderConfig, 'token');
  let stop = false;
  const logs: string[] = [];
  const follower = runFollower(
    { ...leaderConfig, rank: 1, dist: { ...leaderConfig.dist, sharding: 'optimizer' } },
    { execute: async () => undefined, reset: () => undefined, log: (l) => logs.push(l), stopped: () => stop },
    'token',
  );
  await expect(leader.ensure()).rejects.toThrow(
    /refused to join: rank 1: trainer\.dist\.sharding is 'optimizer' here and 'full' on rank 0; give every rank the same/,
  );
  stop = true;
  await follower;
  expect(logs.join('\n')).toContain('not joining trainer process group');
});

test('a follower acts only on what rank 0 signed with the shared token: a process writing to the store steers nothing', async () => {
  const config = trainerRankSchema.parse({ world_size: 2, dist: { port: await freePort(), timeout_s: 5 } });
  const leader = await GroupLeader.start(config, 'the-secret');
  // Another process that reaches the store (libtorch 1.13's listens on every interface).
  const intruder = await native.createStore({ host: '127.0.0.1', port: leader.port, timeoutS: 5 });
  const executed: unknown[] = [];
  const logs: string[] = [];
  let stop = false;
  const follower = runFollower(
    { ...config, rank: 1 },
    {
      execute: async (job) => void executed.push(job),
      reset: () => undefined,
      log: (l) => logs.push(l),
      stopped: () => stop,
    },
    'the-secret',
  );
  try {
    // A process group announced by someone else is not joined.
    await intruder.set('gen', JSON.stringify({ value: 'forged.1', mac: '00' }));
    await until('the forged group refused', () => logs.some((l) => l.includes("is not signed with this rank's token")));
    expect(logs.join('\n')).not.toContain('joining trainer process group forged');

    // Rank 0's group is joined; a job someone else writes into it is not run, and ends the group.
    await leader.ensure();
    const gen = (JSON.parse((await intruder.get('gen', 1000))!) as { value: string }).value;
    await intruder.set(
      `${gen}/job/0`,
      JSON.stringify({ value: JSON.stringify({ op: 'train', runDir: '/x', step: 0 }), mac: 'ab' }),
    );
    await until('the forged job refused', () => logs.some((l) => l.includes('job 0 is not signed')));
    expect(await leader.invalidate()).toEqual([
      "rank 1: job 0 is not signed with this rank's token (TRAINER_DIST_TOKEN): another process wrote to the store; not run",
    ]);
    expect(executed).toEqual([]);

    // Rank 0's own jobs run.
    await leader.ensure();
    const job = { op: 'at', runDir: '/run', step: 3 } as const;
    await leader.dispatch(job);
    await until('the signed job run', () => executed.length === 1);
    expect(executed).toEqual([job]);
  } finally {
    stop = true;
    await follower;
  }
});

test('a trainer rank without the shared token exits 2 naming trainer.dist.token_var', () => {
  const r = worker(['--trainer.rank', '1', '--trainer.world-size', '2', '--trainer.dist.port', '29999'], {});
  expect(r.stderr).toMatch(/trainer\.dist\.token_var: the variable TRAINER_DIST_TOKEN is not set/);
  expect(r.code).toBe(2);
});

function worker(args: string[], env: Record<string, string> = { TRAINER_DIST_TOKEN: 't' }) {
  const r = spawnSync(
    process.execPath,
    [path.join(projectRoot, 'bin', 'prime-rl.js'), 'worker', '--pool', 'trainer', ...args],
    { cwd: projectRoot, env: { PATH: process.env.PATH, ...env }, encoding: 'utf8', timeout: 60_000 },
  );
  return { code: r.status, stderr: r.stderr };
}

const refusedWorkers: [string[], RegExp][] = [
  [['--trainer.world-size', '0'], /trainer\.world_size/],
  [
    ['--trainer.rank', '2', '--trainer.world-size', '2', '--trainer.dist.port', '29999'],
    /trainer\.rank.*below trainer\.world_size \(2\)/,
  ],
  [['--trainer.rank', '-1'], /trainer\.rank/],
  [['--trainer.world-size', '2'], /trainer\.dist\.port: every rank must know/],
  [
    ['--trainer.dist.sharding', 'full'],
    /trainer\.dist\.sharding full: a single trainer rank \(trainer\.world_size 1\)/,
  ],
];
// A build with NCCL starts such a worker.
if (!native.info().nccl)
  refusedWorkers.push([
    ['--trainer.world-size', '2', '--trainer.dist.port', '29999', '--trainer.dist.backend', 'nccl'],
    /trainer\.dist\.backend nccl: this build of the native addon has no NCCL/,
  ]);

test.each(refusedWorkers)('worker %j exits 2 naming the key', (args, message) => {
  const r = worker(args as string[]);
  expect(r.stderr).toMatch(message);
  expect(r.code).toBe(2);
});

test('a follower rank whose store is unreachable exits 2 naming trainer.dist.host / port', async () => {
  const port = await freePort(); // nothing listens there
  const r = worker([
    '--trainer.rank',
    '1',
    '--trainer.world-size',
    '2',
    '--trainer.dist.port',
    String(port),
    '--trainer.dist.timeout-s',
    '1',
  ]);
  expect(r.stderr).toContain(`trainer.dist.host / trainer.dist.port (127.0.0.1:${port}): cannot reach the store`);
  expect(r.code).toBe(2);
  // Rank 0 on an address of no interface here.
  const r0 = worker([
    '--run-name',
    'r0',
    '--trainer.world-size',
    '2',
    '--trainer.dist.host',
    '192.0.2.1',
    '--trainer.dist.port',
    String(port),
    '--trainer.dist.timeout-s',
    '1',
  ]);
  expect(r0.stderr).toContain('trainer.dist.host / trainer.dist.port (192.0.2.1:');
  expect(r0.code).toBe(2);
});

test('rl and sft refuse trainer.world_size 0 before starting anything', () => {
  for (const cmd of ['rl', 'sft']) {
    const r = spawnSync(
      process.execPath,
      [
        path.join(projectRoot, 'bin', 'prime-rl.js'),
        cmd,
        '--model.name',
        modelDir,
        '--trainer.world-size',
        '0',
        '--dry-run',
      ],
      { cwd: projectRoot, env: { PATH: process.env.PATH }, encoding: 'utf8' },
    );
    expect(r.stderr).toMatch(/trainer\.world_size/);
    expect(r.status).toBe(2);
  }
});
