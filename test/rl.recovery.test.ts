/**
 * Recovery, tested: a real run launched as `prime-rl rl` launches it (Temporal dev server,
 * inference server, cpu and trainer workers as processes), under chaos: SIGKILLs of randomly chosen
 * processes, the launcher itself included (followed by a re-run of the same command); SIGSTOPs of
 * each kind, resumed (SIGCONT) only after longer than the heartbeat timeout; and a damaged run
 * folder (the newest checkpoint and a batch the replay needs truncated, then the trainer killed);
 * each once the run has made progress since the previous one. The launcher restarts what it owns
 * and what falls silent, a re-run stops what a killed launcher left and takes over its Temporal
 * server, the trainer rebuilds the damaged batch; the run must complete with every step trained
 * exactly once (counters equal to an uninterrupted run's), each metrics line once, the same
 * sampled tokens at every step and the same final weights (to float tolerance).
 *
 * The schedule is drawn from a seed, printed with it: CHAOS_SEED=<seed> repeats a schedule.
 */
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { pick, Rng, shuffle, uniformInt } from '../lib/envs/random';
import { loadHfModel } from '../lib/model/hf';
import { ConfigError } from '../lib/failures';
import { freePort } from '../lib/net';
import { asProcessId, isRunning, processId } from '../lib/proc';
import { listSteps, RunLayout } from '../lib/runfolder/layout';
import { CKPT_FILE } from '../lib/runfolder/checkpoint';
import { isListening, runningDevServer } from '../lib/temporal/devserver';
import { readRollouts } from '../lib/runfolder/rollouts';
import { launchRun } from '../lib/launch';
import { metricSteps, sleep, until, type CliLaunch } from './support/processes';
import { chaosScene, checkRun, recordedProcesses, tinyRunArgs } from './support/rl-chaos';
import { rlConfig } from './support/setup';

jest.setTimeout(10 * 60_000);

const { root, modelDir, outputDir, cli, stopAll } = chaosScene('prime-recovery-');
// Enough steps for every event: a stop or a kill lets about 3-4 steps pass (up to 7 were seen).
const STEPS = 80;
const KILLS = 10;

/** `prime-rl rl` arguments of a tiny run on its own ports. */
const runArgs = (name: string) => tinyRunArgs({ name, modelDir, outputDir, steps: STEPS });

/** Inverse-CDF boundary flips a run may show against another of the same seeds (see the chaos test). */
const MAX_FLIPS = 2;

/**
 * The tokens of `run` that differ from `reference`'s, step by step, rollout by rollout, as
 * "step s rollout r sample k token t: a -> b". Throws on any difference other than a boundary flip
 * (b = a +- 1): another example, seed or policy version, another number of samples or tokens.
 */
function tokenFlips(run: RunLayout, reference: RunLayout): string[] {
  const flips: string[] = [];
  for (let step = 0; step < STEPS; step++) {
    const [ours, theirs] = [readRollouts(run.rolloutsDir(step)), readRollouts(reference.rolloutsDir(step))];
    const id = (r: (typeof ours)[number]) =>
      JSON.stringify([
        r.env,
        r.exampleIndex,
        r.sample,
        r.seed,
        r.policyVersion,
        r.samples.flat().map((x) => x.tokens.length),
      ]);
    expect(ours.map(id)).toEqual(theirs.map(id));
    ours.forEach((r, i) => {
      const refs = theirs[i].samples.flat();
      r.samples.flat().forEach((x, k) => {
        const ref = refs[k].tokens;
        Array.from(x.tokens).forEach((t, j) => {
          if (t === ref[j]) return;
          const flip = `step ${step} rollout ${i} sample ${k} token ${j}: ${ref[j]} -> ${t}`;
          if (Math.abs(t - ref[j]) !== 1) throw new Error(`not a boundary flip: ${flip}`);
          flips.push(flip);
        });
      });
    });
  }
  return flips;
}

/** The last lines of each log in the run's logs folder, the workflow worker's (orchestrator.log) last. */
function logTails(layout: RunLayout, lines = 25): string {
  if (!fs.existsSync(layout.logsDir)) return '(no logs folder)';
  const last = (f: string) => (f === 'orchestrator.log' ? 1 : 0);
  return fs
    .readdirSync(layout.logsDir)
    .sort((a, b) => last(a) - last(b) || a.localeCompare(b))
    .map((f) => {
      const text = fs.readFileSync(path.join(layout.logsDir, f), 'utf8').trimEnd().split('\n');
      return `--- ${f} (last ${Math.min(lines, text.length)} lines)\n${text.slice(-lines).join('\n')}`;
    })
    .join('\n');
}

/** The workflow's pending activities and workflow task as Temporal describes them (or why not). */
async function pendingWork(port: number, workflowId: string): Promise<string> {
  let connection: Connection | undefined;
  try {
    connection = await Connection.connect({ address: `127.0.0.1:${port}`, connectTimeout: 5_000 });
    const handle = new Client({ connection }).workflow.getHandle(workflowId);
    const d = await handle.describe();
    const ts = (t?: { seconds?: unknown } | null) =>
      t?.seconds ? new Date(Number(t.seconds) * 1000).toISOString() : '-';
    const activities = (d.raw.pendingActivities ?? []).map(
      (a) =>
        `  ${a.activityType?.name} state ${a.state} attempt ${a.attempt} scheduled ${ts(a.scheduledTime)} ` +
        `started ${ts(a.lastStartedTime)} heartbeat ${ts(a.lastHeartbeatTime)} next attempt ${ts(a.nextAttemptScheduleTime)} ` +
        `worker ${a.lastWorkerIdentity} last failure: ${a.lastFailure?.message ?? '-'}`,
    );
    const task = d.raw.pendingWorkflowTask;
    // Workflow tasks that failed or timed out say why a run stalls with no activity pending; the
    // newest events say where it stands.
    const events = (await handle.fetchHistory()).events ?? [];
    const describe = (e: (typeof events)[number]) => {
      const failed = e.workflowTaskFailedEventAttributes;
      const timedOut = e.workflowTaskTimedOutEventAttributes;
      const started = e.workflowTaskStartedEventAttributes;
      const detail = failed
        ? ` cause ${failed.cause} by ${failed.identity}: ${failed.failure?.message ?? '-'}`
        : timedOut
          ? ` timeout type ${timedOut.timeoutType}`
          : started
            ? ` by ${started.identity}`
            : '';
      return `  #${e.eventId} ${ts(e.eventTime)} type ${e.eventType}${detail}`;
    };
    const taskTrouble = events.filter(
      (e) => e.workflowTaskFailedEventAttributes || e.workflowTaskTimedOutEventAttributes,
    );
    return [
      `workflow ${d.status.name}, now ${new Date().toISOString()}, pending activities:`,
      ...activities,
      `pending workflow task: ${task ? `state ${task.state} attempt ${task.attempt} scheduled ${ts(task.scheduledTime)} started ${ts(task.startedTime)}` : 'none'}`,
      `workflow tasks failed or timed out (${taskTrouble.length}):`,
      ...taskTrouble.slice(-8).map(describe),
      `last events of ${events.length}:`,
      ...events.slice(-12).map(describe),
    ].join('\n');
  } catch (e) {
    return `(no description of workflow ${workflowId}: ${(e as Error).message})`;
  } finally {
    await connection?.close();
  }
}

const KINDS = ['trainer', 'inference', 'cpu', 'temporal', 'launcher'] as const;
type Kind = (typeof KINDS)[number];
/** A SIGKILL, a SIGSTOP (resumed after `STOPPED_MS`), or the trainer's run folder damaged. */
type Fault = { kind: Kind; how: 'kill' | 'stop' } | { kind: 'trainer'; how: 'damage' };
/** How long a stopped launcher stays stopped: longer than the run's heartbeat timeout (5 s). */
const STOPPED_MS = 7_000;

/** The launcher's line when it kills process `pid` for being silent (lib/launch/supervise.ts). */
const silentLine = (pid: number) => new RegExp(`\\(pid ${pid}\\) silent for [\\d.]+ s .*: killing it`);

/** The step of the run's newest checkpoint, or -1. */
function newestCheckpoint(layout: RunLayout): number {
  const steps = fs.existsSync(layout.checkpointsRoot) ? listSteps(fs.readdirSync(layout.checkpointsRoot)) : [];
  return steps.length > 0 ? Math.max(...steps) : -1;
}

/** The pid of the launcher recorded in `<run>/launcher.json`. */
function recordedLauncher(layout: RunLayout): number | undefined {
  try {
    return asProcessId((JSON.parse(fs.readFileSync(layout.launcherFile, 'utf8')) as { launcher: unknown }).launcher)
      ?.pid;
  } catch {
    return undefined;
  }
}

test('chaos: random SIGKILLs of every process, the launcher included, SIGSTOPs of each, a damaged run folder, end with the counters of an uninterrupted run', async () => {
  const calm = await launchRun(rlConfig(await runArgs('calm')), { quiet: true });
  try {
    expect((await calm.result).steps).toBe(STEPS);
  } finally {
    await calm.stop();
  }
  const expected = checkRun(calm.layout, STEPS);
  expect(expected.tokens).toBeGreaterThan(0);

  // Kills: each kind of process at least once, the launcher twice, the rest at random. Stops: each
  // kind once. One damaged run folder. All in random order, each after a random delay once the run
  // has trained a step since the previous event.
  const seed =
    process.env.CHAOS_SEED !== undefined ? Number(process.env.CHAOS_SEED) : Math.floor(Math.random() * 2 ** 31);
  const rng = new Rng(seed, 'chaos');
  const schedule = shuffle(rng, [
    ...[...KINDS, 'launcher' as const, ...Array.from({ length: KILLS - KINDS.length - 1 }, () => pick(rng, KINDS))].map(
      (kind): Fault => ({ kind, how: 'kill' }),
    ),
    ...KINDS.map((kind): Fault => ({ kind, how: 'stop' })),
    { kind: 'trainer', how: 'damage' },
  ]);
  // A step takes a fraction of a second here: the delay puts the event anywhere in the next one.
  const delays = schedule.map(() => uniformInt(rng, 0, 400));
  const events = [
    `chaos seed ${seed} (CHAOS_SEED=${seed} repeats this schedule): ${schedule.map((f, i) => `${f.how} ${f.kind} +${delays[i]}ms`).join(', ')}`,
  ];
  console.log(events[0]);

  const args = ['rl', ...(await runArgs('chaos'))];
  const config = rlConfig(args.slice(1));
  const layout = RunLayout.of(outputDir, 'chaos');
  const steps = () => metricSteps(layout.metricsFile).length;
  let launcher: CliLaunch = cli.start(args);
  /** Waits for `ok()`; the current launcher must not exit meanwhile. */
  const whileRunning = (what: string, ok: () => boolean) =>
    until(`${what}\n${events.join('\n')}`, () => {
      if (ok()) return true;
      if (launcher.exit !== undefined)
        throw new Error(
          `the launcher exited (${launcher.exit}) during the chaos:\n${launcher.output()}\n${events.join('\n')}`,
        );
      return false;
    }).catch(async (e: Error) => {
      // A stall names itself: the workflow's pending work, what the launcher printed, each log's tail.
      const pending = await pendingWork(config.temporal.port, 'chaos');
      throw new Error(
        `${e.message}\n${pending}\nlauncher output:\n${launcher.output().slice(-3000)}\n${logTails(layout)}`,
      );
    });
  const stepAfter = (done: number) => whileRunning(`a step after step ${done - 1}`, () => steps() > done);
  const damaged: string[] = [];
  // What every launcher of the run said (a re-run appends to the same log).
  const launcherLog = () => fs.readFileSync(path.join(layout.logsDir, 'launcher.log'), 'utf8');
  try {
    await stepAfter(0);
    // The same run name in another output dir is another run: refused, never attached to this one.
    const elsewhere = {
      ...config,
      output_dir: path.join(root, 'elsewhere'),
      inference: { ...config.inference, server: { ...config.inference.server, port: await freePort() } },
    };
    await expect(launchRun(elsewhere, { quiet: true })).rejects.toThrow(
      `workflow chaos is running for run folder ${path.resolve(layout.dir)}, not ${path.join(root, 'elsewhere', 'chaos')}: use another run_name`,
    );

    for (const [i, { kind, how }] of schedule.entries()) {
      await sleep(delays[i]);
      const done = steps();
      if (done >= STEPS)
        throw new Error(`the run ended after ${i} of ${schedule.length} events: raise STEPS\n${events.join('\n')}`);
      let pid: number | undefined;
      await until(`a running ${kind} to ${how}\n${events.join('\n')}`, () => {
        pid =
          kind === 'launcher'
            ? launcher.child.pid
            : kind === 'temporal'
              ? runningDevServer(outputDir)?.pid
              : recordedProcesses(layout)[kind]?.pid;
        return pid !== undefined;
      });
      const event = `${how} ${i + 1}/${schedule.length} after step ${done - 1}: ${kind} (pid ${pid})`;
      if (how === 'stop') {
        // Frozen for longer than the heartbeat timeout: the launcher finds a child (or the Temporal
        // server) silent and kills it, so it restarts (without that, nothing would move until the
        // SIGCONT); it says so only once the child was silent past the timeout, so the child stays
        // frozen until then. A frozen launcher, resumed after STOPPED_MS, kills nothing.
        const id = processId(pid);
        process.kill(pid!, 'SIGSTOP');
        events.push(event);
        if (kind === 'launcher') await sleep(STOPPED_MS);
        else await whileRunning(`the ${kind} (pid ${pid}) found silent`, () => silentLine(pid!).test(launcherLog()));
        if (id && isRunning(id)) process.kill(pid!, 'SIGCONT');
        await stepAfter(done);
        continue;
      }
      if (how === 'damage') {
        // The issue's probe: the newest checkpoint and a batch the replay from the one before needs,
        // both truncated, then the trainer killed (frozen first, so that no newer checkpoint
        // appears meanwhile). It rebuilds the batch from its rollouts and goes on.
        await whileRunning('a checkpoint', () => newestCheckpoint(layout) >= 2);
        process.kill(pid!, 'SIGSTOP');
        const newest = newestCheckpoint(layout);
        for (const file of [path.join(layout.checkpointDir(newest), CKPT_FILE), layout.batchFile(newest - 1)])
          fs.truncateSync(file, fs.statSync(file).size >> 1);
        damaged.push(layout.batchFile(newest - 1));
        process.kill(pid!, 'SIGKILL');
        events.push(`${event}: checkpoint ${newest} and batch ${newest - 1} truncated`);
        await stepAfter(done);
        continue;
      }
      const left = kind === 'launcher' ? Object.values(recordedProcesses(layout)) : [];
      process.kill(pid!, 'SIGKILL');
      events.push(event);
      if (kind === 'launcher') {
        // The same command again, at once: the killed launcher's processes may still be shutting
        // down (even finishing a step). Once the re-run has recorded itself, it has stopped them.
        await launcher.exited;
        launcher = cli.start(args);
        await whileRunning('the re-run to record itself', () => recordedLauncher(layout) === launcher.child.pid);
        expect(left.filter(isRunning)).toEqual([]);
        await stepAfter(steps());
        expect(launcher.output()).not.toContain('already in use');
      } else {
        await stepAfter(done);
      }
    }
    console.log(events.join('\n'));

    expect(await launcher.exited).toBe(0);
    expect(launcher.output()).toContain(`run chaos completed: ${STEPS} steps`);
    // Nothing is left running: no record of processes, the Temporal server (taken over) stopped.
    expect(fs.existsSync(layout.launcherFile)).toBe(false);
    expect(runningDevServer(outputDir)).toBeUndefined();
    expect(await isListening('127.0.0.1', config.temporal.port)).toBe(false);
  } finally {
    stopAll();
  }
  expect(checkRun(layout, STEPS)).toEqual(expected);
  // The damaged batch was found and rebuilt by the restarted trainer (its log says so).
  const trainerLog = fs.readFileSync(path.join(layout.logsDir, 'trainer.log'), 'utf8');
  for (const file of damaged) expect(trainerLog).toContain(`damaged batch: ${file} is damaged`);
  // Runs are reproducible whatever the timing: every step samples the same tokens (same policy
  // versions, same seeds), with one exception the engine admits. The inference logits can differ in
  // the last bits with how requests were batched (a retried step regroups them, and continuous
  // batching groups them by arrival; the CPU engine is not batch-invariant to the ulp), so once in
  // tens of thousands of tokens the uniform draw of the inverse-CDF sampler (token order) lands
  // within rounding of a CDF boundary and picks the neighbouring token id. The draws that follow
  // are the same (one draw per token), so the sample goes on with the same tokens. Such a flip is
  // allowed, rarely; anything else (another seed, a lost or repeated rollout, a shorter sample) is
  // not. Policy versions are compared exactly.
  const flips = tokenFlips(layout, calm.layout);
  if (flips.length > 0) console.log(`boundary flips (calm -> chaos):\n${flips.join('\n')}`);
  expect(flips.length).toBeLessThanOrEqual(MAX_FLIPS);
  // The trainer's importance ratios use those inference logprobs: the final weights agree to float
  // tolerance, not bit for bit.
  // Tolerance: one Adam step at this lr (1e-3) moves a weight by about lr at most; a step applied
  // twice or skipped is caught exactly by the counters above.
  const floats = (t: { data: Buffer }) => new Float32Array(new Uint8Array(t.data).buffer);
  const weights = (l: RunLayout) => new Map(loadHfModel(l.weightsDir(STEPS)).tensors.map((t) => [t.name, t] as const));
  const [chaosWeights, calmWeights] = [weights(layout), weights(calm.layout)];
  expect([...chaosWeights.keys()]).toEqual([...calmWeights.keys()]);
  for (const [name, t] of chaosWeights) {
    expect(t.dtype).toBe('F32');
    const [a, b] = [floats(t), floats(calmWeights.get(name)!)];
    let worst = 0;
    for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]));
    // Names the tensor and its worst difference when it fails.
    expect(`${name}: ${worst < 1e-3 ? 'close' : worst}`).toBe(`${name}: close`);
  }
});

test('a trainer rank that stops answering for good (SIGSTOP, never resumed) is found silent and restarted: the run completes, every step once', async () => {
  // Rank 0's collectives wait for it until trainer.dist.timeout_s, fail, and the retried step waits
  // for it to join a new process group; without a heartbeat deadline it never would.
  const steps = 6;
  const args = [
    'rl',
    ...(await tinyRunArgs({ name: 'frozen', modelDir, outputDir, steps })),
    ...['--trainer.world-size', '2', '--trainer.dist.timeout-s', '10'],
  ];
  const layout = RunLayout.of(outputDir, 'frozen');
  const done = () => metricSteps(layout.metricsFile).length;
  const launcher = cli.start(args);
  const stalled = (what: string) => `${what}\nlauncher output:\n${launcher.output().slice(-3000)}\n${logTails(layout)}`;
  try {
    await until(stalled('a step before rank 1 freezes'), () => done() > 1, 180_000);
    const pid = recordedProcesses(layout)['trainer-1']?.pid;
    expect(pid).toBeDefined();
    process.kill(pid!, 'SIGSTOP');
    await until(
      stalled(`the launcher to find rank 1 (pid ${pid}) silent`),
      () => silentLine(pid!).test(launcher.output()),
      60_000,
    );
    expect(await launcher.exited).toBe(0);
    expect(launcher.output()).toContain(`run frozen completed: ${steps} steps`);
  } finally {
    stopAll();
  }
  checkRun(layout, steps);
});

test('a port taken by another process is refused before anything starts, never shared', async () => {
  const other = net.createServer().listen(0, '127.0.0.1');
  await new Promise((r) => other.once('listening', r));
  const { port } = other.address() as net.AddressInfo;
  try {
    const config = rlConfig(await runArgs('taken'));
    const launched = launchRun(
      { ...config, inference: { ...config.inference, server: { ...config.inference.server, port } } },
      { quiet: true },
    );
    // A ConfigError: the CLI prints it in one line and exits 2.
    await expect(launched).rejects.toThrow(ConfigError);
    await expect(launched).rejects.toThrow(`inference.server.port: 127.0.0.1:${port} is already in use`);
  } finally {
    other.close();
  }
});
