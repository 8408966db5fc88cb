/**
 * Several inference servers serving one run (issue #18, item 4): real servers over HTTP, in this
 * process or as `prime-rl inference` processes that a test SIGKILLs. Requests go by load, a dead
 * server's requests move to the others, a server that comes back gets the policy before requests,
 * and an rl run survives losing one of its two servers with every step done once.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { InferenceServer } from '../lib/inference/server';
import { freePort } from '../lib/net';
import { InferenceClient, InferenceError, type GenerateParams } from '../lib/orchestrator/client';
import { RunLayout } from '../lib/runfolder/layout';
import { readStepMetrics } from '../lib/runfolder/metrics';
import { executeRl, startServer, startStack, type Stack } from './support/harness';
import { CliProcesses, inferenceProcess, metricSteps, settlesWithin, sleep, until } from './support/processes';
import { lowercaseEnv, rlConfig, smallStep, tinyModel } from './support/setup';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-fleet-'));
const modelDir = path.join(root, 'model');
const outputs = path.join(root, 'outputs');
const servers: InferenceServer[] = [];
let stack: Stack;
let procs: CliProcesses;

beforeAll(async () => {
  tinyModel(modelDir);
  stack = await startStack(root);
  procs = new CliProcesses(path.join(root, 'logs'));
});
afterAll(async () => {
  procs?.cleanup();
  for (const s of servers) await s.close(1000).catch(() => undefined); // some closed by their test
  await stack?.close();
  fs.rmSync(root, { recursive: true, force: true });
});

async function server(port = 0): Promise<InferenceServer> {
  const s = await startServer(root, { modelDir, seqLen: 512, settings: { server: { port } } });
  servers.push(s);
  return s;
}

const params = (seed: number, maxTokens = 4): GenerateParams => ({
  temperature: 1,
  top_p: 1,
  top_k: -1,
  min_p: 0,
  max_tokens: maxTokens,
  seed,
});

/** Sends requests through `fleet` until server `index` has answered one. */
const untilServed = (fleet: InferenceClient, index: number, what: string, limitMs: number) =>
  until(
    what,
    async () => {
      await Promise.all(Array.from({ length: 4 }, (_, i) => fleet.generate([1, 2], params(i))));
      return fleet.servers()[index].served > 0;
    },
    limitMs,
  );

/** A server's /metrics: generate requests answered, sequences decoding now. */
async function load(url: string): Promise<{ answered: number; running: number }> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const answered = text.match(/prime_inference_requests_total\{route="\/v1\/generate",status="200"\} (\d+)/);
  const running = text.match(/prime_inference_running_sequences (\d+)/);
  return { answered: answered ? Number(answered[1]) : 0, running: running ? Number(running[1]) : 0 };
}
const answered = async (url: string) => (await load(url)).answered;

test('requests go to the server with the fewest in flight, not in turn, within each slot cap', async () => {
  const [a, b] = [await server(), await server()];
  const client = new InferenceClient([`${a.url}/v1`, `${b.url}/v1`], { maxInFlight: 2 });
  // A long request holds one server; short ones issued one after another while it runs all go to
  // the other (in turn, every second one would queue behind the long one).
  const long = client.generate([1, 2, 3], { ...params(0, 480), temperature: 0 });
  const busy = client.servers().findIndex((s) => s.inFlight === 1);
  for (let i = 0; i < 4; i++) await client.generate([4, 5], params(i));
  expect(client.servers()[busy].inFlight).toBe(1); // the long request was still running
  expect(client.servers().map((s) => s.served)).toEqual(busy === 0 ? [0, 4] : [4, 0]);
  await long;
  const before = client.servers().map((s) => s.served);
  // 12 at once with 2 slots per server: never more than 2 in flight on one, both used equally.
  let most = 0;
  const burst = Array.from({ length: 12 }, async (_, i) => {
    const r = client.generate([6, 7, 8], params(100 + i));
    most = Math.max(most, ...client.servers().map((s) => s.inFlight));
    return r;
  });
  await Promise.all(burst);
  expect(most).toBe(2);
  const burstServed = client.servers().map((s, i) => s.served - before[i]);
  expect(burstServed[0] + burstServed[1]).toBe(12);
  expect(Math.min(...burstServed)).toBeGreaterThanOrEqual(4); // spread, not piled on one
}, 120_000);

test('a dead server is set aside; its requests go elsewhere, with the samples one server gives; back, it gets the policy first', async () => {
  const live = await server();
  const deadPort = await freePort();
  const weights = path.join(outputs, 'fleet-policy', 'step_1');
  tinyModel(weights, { seed: 7 });
  const policy = { version: 1, weightDir: weights };
  const fleet = new InferenceClient([`http://127.0.0.1:${deadPort}/v1`, `${live.url}/v1`]);
  await fleet.ensurePolicy(policy);
  expect(fleet.servers().map((s) => s.aside)).toEqual([true, false]);
  const prompts = Array.from({ length: 6 }, (_, i) => [10 + i, 20, 30]);
  const viaFleet = await Promise.all(prompts.map((p, i) => fleet.generate(p, params(i, 8))));
  expect(viaFleet.map((r) => r.policyVersion)).toEqual(prompts.map(() => 1));
  // The same requests on one server alone: the same samples (seeds are per request).
  const single = new InferenceClient([`${live.url}/v1`]);
  await single.ensurePolicy(policy);
  const viaOne = await Promise.all(prompts.map((p, i) => single.generate(p, params(i, 8))));
  expect(viaFleet.map((r) => r.tokenIds)).toEqual(viaOne.map((r) => r.tokenIds));

  // The server comes up on that port with its base model: a probe brings it to version 1 before
  // any request reaches it.
  const back = await server(deadPort);
  expect(((await (await fetch(`${back.url}/health`)).json()) as { policy_version: number }).policy_version).toBe(0);
  await untilServed(fleet, 0, 'the revived server is probed and given requests', 30_000);
  expect(((await (await fetch(`${back.url}/health`)).json()) as { policy_version: number }).policy_version).toBe(1);
  expect(fleet.servers()[0].aside).toBe(false);

  // A server that lost its weights between two requests (restarted: here reloaded to the base
  // model behind the client's back) answers from version 0: that answer is not used, the request
  // moves, and the server gets the policy again before more requests.
  expect((await fetch(`${back.url}/reload_weights`, { method: 'POST', body: '{}' })).ok).toBe(true);
  const afterReload = await Promise.all(Array.from({ length: 4 }, (_, i) => fleet.generate([3, 4], params(i))));
  expect(afterReload.map((r) => r.policyVersion)).toEqual([1, 1, 1, 1]);
  expect(fleet.servers()[0].aside).toBe(true);
  await until('the reloaded server is brought back to version 1', async () => {
    await fleet.generate([1, 2], params(0));
    return !fleet.servers()[0].aside;
  });
  expect(((await (await fetch(`${back.url}/health`)).json()) as { policy_version: number }).policy_version).toBe(1);

  // Every server gone: a request fails `unavailable`, naming each server's last error.
  await back.close(1000);
  await live.close(1000);
  const none = await fleet.generate([1, 2], params(0)).catch((e: unknown) => e);
  expect(none).toBeInstanceOf(InferenceError);
  expect((none as InferenceError).kind).toBe('unavailable');
  expect((none as InferenceError).message).toMatch(/no inference server left \(2 configured\)/);
}, 120_000);

test('a server that stops answering (SIGSTOP: the kernel still accepts its connections) is found silent; its requests move', async () => {
  const live = await server();
  const { launch: frozen, url } = await inferenceProcess(procs, modelDir, 512);
  // Found silent after 2 s without any answer, not even to /health (runs: temporal.heartbeat_timeout_s).
  const fleet = new InferenceClient([`${url}/v1`, `${live.url}/v1`], { livenessMs: 2_000 });
  await fleet.ensurePolicy({ version: 0, weightDir: modelDir });
  process.kill(frozen.child.pid!, 'SIGSTOP');
  // Requests go to both servers in turn; those on the frozen one get no answer (their own deadline
  // is 10 minutes), and move to the live one once it is found silent.
  const requests = Promise.all(Array.from({ length: 6 }, (_, i) => fleet.generate([5 + i, 6], params(i, 8))));
  expect(await settlesWithin(requests, 60_000)).toBe(true);
  const results = await requests;
  expect(results).toHaveLength(6);
  expect(fleet.servers().map((s) => s.aside)).toEqual([true, false]);
  expect(fleet.servers()[0].served).toBe(0);
  // A policy change meanwhile waits for no answer from it either: the frozen server stays aside.
  expect(await settlesWithin(fleet.ensurePolicy({ version: 0, weightDir: modelDir }), 30_000)).toBe(true);
  // Running again, a probe finds it back, and it gets requests.
  process.kill(frozen.child.pid!, 'SIGCONT');
  await untilServed(fleet, 0, 'the resumed server gets requests again', 60_000);
  frozen.child.kill('SIGTERM');
  await settlesWithin(frozen.exited, 10_000);
}, 180_000);

test('an rl run on two `prime-rl inference` processes, one SIGKILLed mid-run, completes with every step once', async () => {
  const ports = [await freePort(), await freePort()];
  const launched = ports.map((port) =>
    procs.start([
      'inference',
      '--model.name',
      modelDir,
      '--output-dir',
      outputs,
      '--seq-len',
      '128',
      '--threads',
      '1',
      '--server.port',
      String(port),
    ]),
  );
  const urls = ports.map((p) => `http://127.0.0.1:${p}`);
  await until('both servers answer /health', async () => {
    const ok = await Promise.all(
      urls.map((u) =>
        fetch(`${u}/health`).then(
          (r) => r.ok,
          () => false,
        ),
      ),
    );
    return ok.every(Boolean);
  });
  const cfg = rlConfig([
    '--model.name',
    modelDir,
    '--output-dir',
    outputs,
    '--run-name',
    'fleet-kill',
    '--seq-len',
    '128',
    '--orchestrator.base-urls',
    ...urls.map((u) => `${u}/v1`),
    '--env',
    lowercaseEnv,
    ...smallStep(64),
    '--trainer.optim.lr',
    '1e-3',
    '--trainer.threads',
    '1',
    '--max-steps',
    '4',
  ]);
  let killedAfter = -1;
  const result = await executeRl(stack, cfg, {
    executionTimeout: '5 minutes',
    // Killed while it decodes requests of a step after the first: they move to the other server,
    // which serves the rest of the run alone.
    drive: async () => {
      const deadline = Date.now() + 120_000;
      for (;;) {
        const l = await load(urls[1]);
        if (l.answered >= 4 && l.running > 0) {
          killedAfter = l.answered;
          break;
        }
        if (Date.now() > deadline) throw new Error('server 1 never decoded after step 0');
        await sleep(10);
      }
      launched[1].child.kill('SIGKILL');
      await launched[1].exited;
    },
  });
  expect(killedAfter).toBeLessThan(16); // it died before the run's end
  expect(result.steps).toBe(4);
  const layout = RunLayout.of(cfg.output_dir, cfg.run_name);
  expect(metricSteps(layout.metricsFile)).toEqual([0, 1, 2, 3]);
  expect(readStepMetrics(layout.metricsFile).map((l) => l.rollouts_errored)).toEqual([0, 0, 0, 0]);
  // The survivor answered the rest, and serves the last policy.
  expect(await answered(urls[0])).toBeGreaterThanOrEqual(16);
  const health = (await (await fetch(`${urls[0]}/health`)).json()) as { policy_version: number };
  expect(health.policy_version).toBeGreaterThanOrEqual(2); // step 3 samples from policy 2 or 3 (async level)
  launched[0].child.kill('SIGTERM');
  await settlesWithin(launched[0].exited, 10_000);
}, 300_000);
