/**
 * `weight_broadcast.type = "nccl"` on CPUs (Gloo), issue #48 item 3: trainer rank 0 sends a new
 * policy version to the inference servers over a c10d group while it writes the version's folder.
 * A server updated by the broadcast and one that read the folder generate the same tokens with the
 * same logprobs; and a run whose server is killed mid-broadcast goes on (the folder serves it, and
 * the restarted server is taken into the next group).
 */
import * as path from 'node:path';
import * as native from '../native';
import { InferenceClient } from '../lib/orchestrator/client';
import { RunLayout } from '../lib/runfolder/layout';
import { launchRun } from '../lib/launch';
import { WeightBroadcaster } from '../lib/trainer/broadcast';
import { rlTrainerSpec } from '../lib/trainer/spec';
import { TrainerRuntime } from '../lib/trainer/runtime';
import { randomBatches } from './support/batches';
import { startServer } from './support/harness';
import { metricLines, sleep, until } from './support/processes';
import { chaosScene, checkRun, tinyRunArgs } from './support/rl-chaos';
import { rlConfig } from './support/setup';
import type { InferenceServer } from '../lib/inference/server';

jest.setTimeout(5 * 60_000);
native.setThreads(1);

const { root, modelDir, outputDir } = chaosScene('prime-broadcast-');
const logs: string[] = [];
const log = { info: (l: string) => logs.push(l), warn: (l: string) => logs.push(l) };

async function post<T>(server: InferenceServer, route: string, body: unknown): Promise<T> {
  const res = await fetch(`${server.url}${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${route}: ${res.status} ${text}`);
  return JSON.parse(text) as T;
}

test('a version sent by broadcast generates the same tokens and logprobs as the same version read from its folder', async () => {
  const [viaBroadcast, viaFolder] = [
    await startServer(root, { modelDir, seqLen: 128 }),
    await startServer(root, { modelDir, seqLen: 128 }),
  ];
  try {
    const generate = (s: InferenceServer) =>
      post<{ choices: { token_ids: number[]; logprobs: number[] }[] }>(s, '/v1/generate', {
        prompt_token_ids: [10, 20, 30, 40],
        max_tokens: 24,
        seed: 7,
      }).then((r) => r.choices[0]);
    const base = await generate(viaFolder);

    // One train step of the run's trainer, version 1 written to its folder while it is broadcast.
    const layout = randomBatches(path.join(outputDir, 'bcast'), 1);
    const config = rlConfig(['--model.name', modelDir, '--seq-len', '64', '--trainer.optim.lr', '1e-2']);
    const { runtime } = await TrainerRuntime.restore(layout.dir, rlTrainerSpec(config), 0);
    await runtime.train(0);
    const broadcaster = new WeightBroadcaster(
      { host: '127.0.0.1', port: 0, timeoutS: 30, bucketBytes: 64 * 1024, device: 'cpu' },
      log,
    );
    const client = new InferenceClient([`${viaBroadcast.url}/v1`], {});
    const servers = { names: client.urls, post: <T>(i: number, r: string, b?: unknown) => client.control<T>(i, r, b) };
    const version = await broadcaster.begin(1, layout.weightsDir(1), runtime.policyUnits(), servers);
    expect(version).toBeDefined();
    const dir = await runtime.writeWeights(1, (u, tensors) => version!.unit(u, tensors));
    const report = await version!.end();
    expect(report).toMatchObject({ version: 1, received: [`${viaBroadcast.url}/v1`], missed: [] });
    expect(logs.join('\n')).toMatch(/weight broadcast group \w+\.1 formed with/);

    const update = (s: InferenceServer) =>
      post<{ policy_version: number; source: string }>(s, '/update_weights', { weight_dir: dir, version: 1 });
    expect(await update(viaBroadcast)).toMatchObject({ policy_version: 1, source: 'broadcast' });
    expect(await update(viaFolder)).toMatchObject({ policy_version: 1, source: 'filesystem' });
    const [a, b] = [await generate(viaBroadcast), await generate(viaFolder)];
    expect(a.token_ids).toEqual(b.token_ids);
    expect(a.logprobs).toEqual(b.logprobs);
    expect(a.logprobs).not.toEqual(base.logprobs); // the update changed the model
    // Each server's /metrics count where its versions came from.
    const metrics = async (s: InferenceServer) => (await fetch(`${s.url}/metrics`)).text();
    expect(await metrics(viaBroadcast)).toMatch(/prime_inference_weight_updates_total\{source="broadcast"\} 1/);
    expect(await metrics(viaFolder)).toMatch(/prime_inference_weight_updates_total\{source="filesystem"\} 1/);
  } finally {
    await Promise.all([viaBroadcast.close(), viaFolder.close()]);
  }
});

test('a server killed mid-broadcast: its version comes from the folder, the run goes on, the restarted server rejoins', async () => {
  const steps = 8;
  // The trainer is held (SIGSTOP) while the killed server restarts, below: the liveness deadline
  // (the heartbeat timeout) must outlast a server's start on a loaded machine.
  const args = await tinyRunArgs({ name: 'killed', modelDir, outputDir, steps, heartbeatTimeoutS: 60 });
  const http = rlConfig(args).inference.server.port;
  const config = rlConfig([
    ...args,
    // Two servers, on consecutive ports, both sampled from.
    ...[
      '--inference.replicas',
      '2',
      '--orchestrator.base-urls',
      JSON.stringify([http, http + 1].map((p) => `http://127.0.0.1:${p}/v1`)),
    ],
    ...['--weight-broadcast.type', 'nccl', '--weight-broadcast.port', '0', '--weight-broadcast.timeout-s', '10'],
  ]);
  const run = await launchRun(config, { quiet: true });
  const lines = () => metricLines(RunLayout.of(outputDir, 'killed').metricsFile);
  const answers = () =>
    fetch(`http://127.0.0.1:${http}/health`).then(
      (r) => r.ok,
      () => false,
    );
  try {
    await until('a version broadcast to both servers', () => lines().some((l) => l.weight_broadcast_servers === 2));
    // Stopped, it stays a member of the group: the next version's broadcast waits on it; killed then.
    const pid = run.processes.inference.pid!;
    process.kill(pid, 'SIGSTOP');
    await sleep(3_000);
    process.kill(pid, 'SIGKILL');
    // A tiny run's steps take a fraction of a second, a server's start (the launcher's pause, Node,
    // the model) several seconds: without a pause the run could end before the server is back (it
    // did, beside the rest of the suite). So the trainer waits, stopped, until the restarted server
    // answers; its next version then forms a group with both.
    const trainer = run.processes.trainer.pid!;
    process.kill(trainer, 'SIGSTOP');
    try {
      await until(
        'the killed server restarted',
        async () => run.processes.inference.restarts === 1 && (await answers()),
        50_000,
      );
    } finally {
      process.kill(trainer, 'SIGCONT');
    }
    expect((await run.result).steps).toBe(steps);
  } finally {
    await run.stop();
  }
  checkRun(RunLayout.of(outputDir, 'killed'), steps);
  const reached = lines().map((l) => l.weight_broadcast_servers);
  const missed = lines().findIndex((l) => (l.weight_broadcast_missed as number) > 0);
  expect(missed).toBeGreaterThan(0); // a version the killed server did not get by broadcast
  // The restarted server is taken into a later group.
  expect(reached.slice(missed + 1)).toContain(2);
  expect(run.processes.inference.restarts).toBe(1);
});
