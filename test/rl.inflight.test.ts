/**
 * In-flight mode, tested with real processes (`prime-rl rl` launches the Temporal dev server, the
 * inference server, cpu and trainer workers): the run completes with every step trained once while
 * the trainer, the inference server, the cpu worker and the Temporal server are each SIGKILLed once
 * mid-run; every sample's tokens name versions within max_off_policy_steps of the step that trained
 * them; the steps took disjoint sets of the finished groups (nothing used twice); each group looked
 * at was trained on, counted as dropped, or left for the next step (its env had its share of the
 * step); the trainer's counters are what the claims
 * add up to, as in an uninterrupted run; no example was played twice across producer restarts; and
 * the producer's concurrency stayed within its cap while it followed the server's load.
 */
import * as fs from 'node:fs';
import { RunLayout } from '../lib/runfolder/layout';
import { runningDevServer } from '../lib/temporal/devserver';
import { readRollouts, storedSummary } from '../lib/runfolder/rollouts';
import { metricLines, metricSteps, until, type CliLaunch } from './support/processes';
import { readBatch } from '../lib/runfolder/batch';
import { chaosScene, checkRun, recordedProcesses, tinyRunArgs } from './support/rl-chaos';

jest.setTimeout(10 * 60_000);

const { modelDir, outputDir, cli, stopAll } = chaosScene('prime-inflight-');
const STEPS = 14;
const MAX_OFF = 2;

const KILLS = ['trainer', 'inference', 'cpu', 'temporal'] as const;

test('in-flight mode: SIGKILLs of trainer, inference, cpu worker and Temporal cost retries; every step trains once on fresh, unshared groups', async () => {
  const args = [
    'rl',
    ...(await tinyRunArgs({ name: 'inflight', modelDir, outputDir, steps: STEPS })),
    '--orchestrator.in-flight.enabled',
    'true',
    '--orchestrator.in-flight.max-off-policy-steps',
    String(MAX_OFF),
    // Every rollout that did not error trains (none left out for a zero advantage), so a step's
    // sample counter follows from its claim alone, as in an uninterrupted run.
    '--orchestrator.filter-zero-advantages',
    'false',
    // Two envs, each with its share of every step: a step takes one group of each, and leaves a
    // second one of an env for the next step.
    '--env',
    '[{"id": "reverse-text"}, {"id": "arithmetic"}]',
    '--orchestrator.in-flight.keep-mix',
    'true',
  ];
  const layout = RunLayout.of(outputDir, 'inflight');
  const steps = () => metricSteps(layout.metricsFile).length;
  const events: string[] = [];
  const launcher: CliLaunch = cli.start(args);
  const stepAfter = (done: number) =>
    until(`a step after step ${done - 1}\n${events.join('\n')}`, () => {
      if (launcher.exit !== undefined) throw new Error(`the launcher exited (${launcher.exit}):\n${launcher.output()}`);
      return steps() > done;
    });
  try {
    await stepAfter(1);
    for (const kind of KILLS) {
      const done = steps();
      if (done >= STEPS) throw new Error(`the run ended before the ${kind} kill: raise STEPS\n${events.join('\n')}`);
      const running = () =>
        kind === 'temporal' ? runningDevServer(outputDir)?.pid : recordedProcesses(layout)[kind]?.pid;
      let pid: number | undefined;
      await until(`a running ${kind} to kill`, () => (pid = running()) !== undefined);
      process.kill(pid!, 'SIGKILL');
      events.push(`kill ${kind} (pid ${pid}) after step ${done - 1}`);
      await stepAfter(done);
      // The run went on because the killed process was replaced, not because it was not needed.
      let replacement: number | undefined;
      await until(`a new ${kind} after the kill of pid ${pid}`, () => (replacement = running()) !== undefined);
      expect(`${kind}: pid ${replacement}`).not.toBe(`${kind}: pid ${pid}`);
      events.push(`${kind} running again as pid ${replacement}`);
    }
    expect(await launcher.exited).toBe(0);
    expect(launcher.output()).toContain(`run inflight completed: ${STEPS} steps`);
  } finally {
    stopAll();
  }
  console.log(events.join('\n'));

  // Every step once, and the trainer's counters equal the batches it was given: none trained twice.
  checkRun(layout, STEPS);
  const lines = metricLines(layout.metricsFile);
  const batches = Array.from({ length: STEPS }, (_, s) => readBatch(layout.batchFile(s)).counts);

  let next = 0;
  let carried: number[] = [];
  let deferrals = 0;
  const taken = new Set<number>();
  for (let step = 0; step < STEPS; step++) {
    // The steps looked at consecutive runs of new groups (besides those left over); each group went to one step.
    const f = storedSummary(layout.dir, step)!.inFlight!;
    expect(f.first).toBe(next);
    next = f.next;
    expect(f.groups).toHaveLength(2);
    // Every group looked at (those the previous step left over, then new ones) was trained on,
    // dropped, or left for the next step, and counted once.
    expect(carried.length + f.next - f.first).toBe(
      f.groups.length + f.staleGroups + storedSummary(layout.dir, step)!.filter.groups_dropped + f.deferred.length,
    );
    for (const g of f.groups) {
      expect(((g >= f.first && g < f.next) || carried.includes(g)) && !taken.has(g)).toBe(true);
      taken.add(g);
      expect(fs.existsSync(layout.inflightGroupFile(g))).toBe(true);
    }
    for (const g of f.deferred) expect((g >= f.first && g < f.next) || carried.includes(g)).toBe(true);
    deferrals += f.deferred.length;
    carried = f.deferred;
    // Every generated token names the version that sampled it: within the bound, never newer than the step.
    const rollouts = readRollouts(layout.rolloutsDir(step));
    expect(rollouts).toHaveLength(8);
    // The trainer got every sample of the step's claim, as an uninterrupted run would: those of the
    // rollouts that did not error (the test's seq_len leaves some reverse-text prompts no room).
    const trainable = rollouts.filter((r) => r.error === undefined).reduce((n, r) => n + r.samples.length, 0);
    expect(`step ${step}: ${batches[step].samples} samples`).toBe(`step ${step}: ${trainable} samples`);
    for (const r of rollouts) {
      for (const seg of r.samples.flat().filter((s) => s.generated)) {
        const versions = Array.from(seg.versions!);
        expect(versions).toHaveLength(seg.tokens.length);
        for (const v of versions)
          expect(`step ${step}: version ${v}`).toBe(
            `step ${step}: version ${Math.min(step, Math.max(v, step - MAX_OFF))}`,
          );
      }
    }
    // The step's metrics: off-policy distance, stale drops, idle times.
    const line = lines[step];
    expect(line.off_policy_max as number).toBeLessThanOrEqual(MAX_OFF);
    expect(line.off_policy_mean as number).toBeLessThanOrEqual(line.off_policy_max as number);
    expect(line.stale_groups_dropped).toBe(f.staleGroups);
    expect(typeof line.inference_idle_seconds).toBe('number');
    // The producer's concurrency limit in effect, in rollouts: the adaptive limit within the cap of
    // max_rollouts = 16 generated ahead.
    expect(line.inflight_concurrency as number).toBeGreaterThanOrEqual(1);
    expect(line.inflight_concurrency as number).toBeLessThanOrEqual(16);
    if (step > 0) expect(line.trainer_idle_seconds as number).toBeGreaterThanOrEqual(0);
  }
  console.log(`groups left over for a later step: ${deferrals} in all`);
  // The producers (one per cpu worker life) never played an example twice: every stored group has its own draw.
  const draws = fs
    .readdirSync(layout.inflightGroupsDir)
    .map((n) => (JSON.parse(fs.readFileSync(`${layout.inflightGroupsDir}/${n}`, 'utf8')) as { draw: number }).draw);
  expect(new Set(draws).size).toBe(draws.length);
  // The producer read the server's load (null only for a step whose groups all finished before a
  // reading, e.g. right after the server came back).
  expect(lines.some((l) => typeof l.inference_running_sequences === 'number')).toBe(true);
  // Training went on while generation did: some step's samples came from a policy older than its own.
  expect(lines.some((l) => (l.off_policy_max as number) > 0)).toBe(true);
});
