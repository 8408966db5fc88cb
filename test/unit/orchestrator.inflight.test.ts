/**
 * In-flight mode's decisions (lib/orchestrator/inflight-decisions.ts): which groups a step takes, and the
 * producer's concurrency; and the load readings it follows (lib/orchestrator/server-load.ts).
 */
import { difficultyFilter } from '../../lib/orchestrator/filters';
import { claimMetrics, claimStep, resumeDraw, STALE } from '../../lib/orchestrator/inflight-decisions';
import type { ClaimCandidate } from '../../lib/runfolder/inflight-groups';
import { parseServerLoad } from '../../lib/orchestrator/server-load';
import { EnvMix } from '../../lib/envs/mix';

type R = { reward: number };
/** Group `seq` of two rollouts sampled with `versions` (-1: none sampled), rewards 0 and `spread`. */
const group = (
  seq: number,
  versions: [number, number],
  spread = 1,
  idleSeconds = 0,
  recorded: Pick<ClaimCandidate<R>, 'concurrency' | 'load'> = {},
): ClaimCandidate<R> => ({
  seq,
  rollouts: versions.map((policyVersion, i) => ({ policyVersion, reward: i * spread })),
  startVersion: 4,
  idleSeconds,
  ...recorded,
});
const view = (c: ClaimCandidate<R>) => ({
  env: 'e',
  exampleIndex: c.seq,
  group: c.seq,
  round: 0,
  rewards: c.rollouts.map((r) => r.reward),
  completionTokens: c.rollouts.map(() => 1),
  errored: 0,
});
const opts = {
  need: 2,
  maxOffPolicySteps: 2,
  filters: [difficultyFilter({ enabled: true, min_reward_variance: 0 })],
  view,
};

test('a step takes the next groups in order, dropping stale ones (oldest token) and filtered ones', () => {
  const groups = [
    group(5, [7, 8]), // step 10 - 7 = 3 > 2: stale by its oldest token
    group(6, [8, 9], 1, 0, { concurrency: 3, load: { running: 10, waiting: 0 } }),
    group(7, [9, 9], 0, 0, { concurrency: 4, load: { running: 12, waiting: 2 } }), // no reward spread: the difficulty filter drops it
    group(8, [-1, 10]), // a rollout that sampled nothing does not make it old
    group(9, [10, 10]), // not needed: left for the next step
  ];
  const d = claimStep(10, [], groups, opts);
  expect(d.complete).toBe(true);
  expect(d.kept.map((c) => c.seq)).toEqual([6, 8]);
  expect(d.dropped.map((x) => [x.candidate.seq, x.reason])).toEqual([
    [5, STALE],
    [7, 'difficulty/reward_variance'],
  ]);
  const { inFlight, filter } = claimMetrics(10, 5, d);
  expect(inFlight).toEqual({
    first: 5,
    next: 9,
    groups: [6, 8],
    deferred: [],
    staleGroups: 1,
    staleRollouts: 2,
    // 10-8, 10-9 and 10-10: the rollout that sampled nothing has no distance
    offPolicyMean: 1,
    offPolicyMax: 2,
    inferenceIdleSeconds: 0,
    // Over the groups looked at that recorded them (groups stored before they were have none).
    concurrencyMean: 3.5,
    serverRunningMean: 11,
    serverWaitingMean: 1,
  });
  expect(claimMetrics(10, 0, claimStep(10, [], [group(0, [9, 9]), group(1, [9, 10])], opts)).inFlight).toMatchObject({
    concurrencyMean: null,
    serverRunningMean: null,
  });
  expect(filter).toEqual({
    groups_generated: 3,
    groups_dropped: 1,
    dropped_by: { 'difficulty/reward_variance': 1 },
    refill_rounds: 0,
    groups_missing: 0,
  });
  // The same groups give the same claim (a retried claim); too few leave it incomplete.
  expect(claimStep(10, [], groups, opts)).toEqual(d);
  expect(claimStep(10, [], groups.slice(0, 3), opts).complete).toBe(false);
});

test('the bound is inclusive: a group exactly max_off_policy_steps behind is taken', () => {
  expect(claimStep(10, [], [group(0, [8, 8]), group(1, [8, 9])], opts).kept).toHaveLength(2);
});

test('each env gets its share of the step: a group beyond it is left for the next step, which looks at it first', () => {
  // Groups 0-2 of entry 0, 3 of entry 1, 4 of entry 0, 5 of entry 1.
  const entries = [0, 0, 0, 1, 0, 1];
  const g = entries.map((_, seq) => group(seq, [10, 10]));
  const mix = (maxDeferred: number) => ({
    quota: [1, 1],
    entryOf: (c: ClaimCandidate<R>) => entries[c.seq],
    maxDeferred,
  });
  const claim = (carried: number[], fresh: number[], maxDeferred = 2) =>
    claimMetrics(
      10,
      fresh[0] ?? 0,
      claimStep(
        10,
        carried.map((i) => g[i]),
        fresh.map((i) => g[i]),
        { ...opts, mix: mix(maxDeferred) },
      ),
    ).inFlight;
  expect(claim([], [0, 1, 2, 3, 4, 5])).toMatchObject({ groups: [0, 3], deferred: [1, 2], first: 0, next: 4 });
  // The next step: group 1 is taken first; 2 stays over; 4 is left over too, 5 completes the step.
  expect(claim([1, 2], [4, 5])).toMatchObject({ groups: [1, 5], deferred: [2, 4], first: 4, next: 6 });
  // At most maxDeferred left over: past it a group is taken beyond its env's share (here group 2).
  expect(claim([], [0, 1, 2, 3], 1)).toMatchObject({ groups: [0, 2], deferred: [1], next: 3 });
  // Carried groups not looked at (the step had all it needed) stay over; no fresh group was looked at.
  const two = {
    ...opts,
    need: 1,
    mix: { quota: [1, 0], entryOf: (c: ClaimCandidate<R>) => entries[c.seq], maxDeferred: 2 },
  };
  const d = claimStep(10, [g[1], g[2]], [g[3]], two);
  expect([d.kept.map((c) => c.seq), d.deferred.map((c) => c.seq), d.fresh]).toEqual([[1], [2], []]);
  // A carried group gone stale is dropped.
  expect(
    claimStep(10, [group(1, [7, 7])], [g[3]], { ...opts, need: 1, mix: mix(2) }).dropped.map((x) => x.reason),
  ).toEqual([STALE]);
});

/**
 * A producer and a claimer playing out against each other: groups of env 0 take 1-2 ticks, env 1's
 * 4-15; a tick finishes some groups; the producer starts groups while fewer than `cap` are ahead of
 * the steps (in flight, finished and not looked at, or left over). Returns the steps' claims.
 */
function simulate(o: { cap: number; maxDeferred: number; dropEntry1: boolean; steps: number }) {
  const perStep = 4;
  const mix = new EnvMix([{ weight: 1 }, { weight: 1 }], { seed: 3, examplesPerStep: perStep });
  const entryOfDraw = (draw: number) => mix.sample(Math.floor(draw / perStep))[draw % perStep].env;
  let seed = 11;
  const random = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  const stored: (ClaimCandidate<R> & { draw: number })[] = [];
  let running: { draw: number; version: number; doneAt: number }[] = [];
  let nextDraw = 0;
  let next = 0;
  let carried: ClaimCandidate<R>[] = [];
  const claims: (ReturnType<typeof claimMetrics<R>>['inFlight'] & { filtered: number })[] = [];
  for (let tick = 0; claims.length < o.steps; tick++) {
    if (tick > 100_000) throw new Error(`stuck at step ${claims.length}`);
    const step = claims.length;
    for (const r of running.filter((r) => r.doneAt <= tick)) {
      const spread = o.dropEntry1 && entryOfDraw(r.draw) === 1 ? 0 : 1; // 0: the difficulty filter drops it
      stored.push({ ...group(stored.length, [r.version, r.version], spread), draw: r.draw });
    }
    running = running.filter((r) => r.doneAt > tick);
    const quota = [0, 0];
    for (const d of mix.sample(step)) quota[d.env]++;
    const d = claimStep(step, carried, stored.slice(next), {
      ...opts,
      need: perStep,
      maxOffPolicySteps: 8,
      mix: { quota, entryOf: (c) => entryOfDraw(stored[c.seq].draw), maxDeferred: o.maxDeferred },
    });
    // The producer's backpressure, as the claim reports it (lib/runfolder/inflight-groups.ts `readConsumed`):
    // groups looked at are no longer waiting, except those left over.
    const waiting = stored.length - (next + d.fresh.length) + d.deferred.length;
    while (running.length + waiting < o.cap) {
      const slow = entryOfDraw(nextDraw) === 1;
      running.push({ draw: nextDraw++, version: step, doneAt: tick + 1 + Math.floor(random() * (slow ? 15 : 2)) });
    }
    if (!d.complete) continue;
    const { inFlight: claim, filter } = claimMetrics(step, next, d);
    expect(claim.deferred.length).toBeLessThanOrEqual(o.maxDeferred);
    claims.push({ ...claim, filtered: filter.groups_dropped });
    next = claim.next;
    carried = d.deferred;
  }
  return { claims, entryOf: (seq: number) => entryOfDraw(stored[seq].draw) };
}

test('claims that keep the mix never stall, take each group once, and keep the mix of most steps', () => {
  const { claims, entryOf } = simulate({ cap: 8, maxDeferred: 4, dropEntry1: false, steps: 300 });
  const taken = claims.flatMap((c) => c.groups);
  expect(new Set(taken).size).toBe(taken.length);
  // Every group looked at was taken or dropped once, or is left over for the next step.
  const last = claims[claims.length - 1];
  const settled = claims.reduce((n, c) => n + c.groups.length + c.staleGroups + c.filtered, 0);
  expect(settled + last.deferred.length).toBe(last.next);
  // The mix of each step (2 + 2 here) holds unless the leftover budget ran out. (In finish order
  // alone, maxDeferred 0, it holds in under half of them: the short env's groups crowd the steps.)
  const kept = claims.filter((c) => c.groups.filter((seq) => entryOf(seq) === 1).length === 2).length;
  expect(kept / claims.length).toBeGreaterThan(0.8);
});

test("an env whose groups are all dropped cannot stall the claims: the others' groups fill the steps past the leftover budget", () => {
  const { claims, entryOf } = simulate({ cap: 8, maxDeferred: 4, dropEntry1: true, steps: 100 });
  expect(claims.every((c) => c.groups.every((seq) => entryOf(seq) === 0))).toBe(true);
  // The tightest budget the producer allows (cap - 1) and none at all work too.
  expect(simulate({ cap: 2, maxDeferred: 1, dropEntry1: true, steps: 50 }).claims).toHaveLength(50);
  expect(simulate({ cap: 1, maxDeferred: 0, dropEntry1: false, steps: 50 }).claims).toHaveLength(50);
});

test("load readings: our gauges, vLLM's (one series per model, summed) and SGLang's; none of them: no reading", () => {
  const ours = [
    '# HELP prime_inference_running_sequences sequences in the running batch',
    '# TYPE prime_inference_running_sequences gauge',
    'prime_inference_running_sequences 12',
    'prime_inference_waiting_sequences 3',
    'prime_inference_waiting_sequences_other 99',
  ].join('\n');
  expect(parseServerLoad(ours)).toEqual({ running: 12, waiting: 3 });
  const vllm = [
    'vllm:num_requests_running{engine="0",model_name="a"} 4.0',
    'vllm:num_requests_running{engine="1",model_name="a"} 5.0',
    'vllm:num_requests_waiting{engine="0",model_name="a"} 0.0 1700000000000',
    'vllm:num_requests_waiting{engine="1",model_name="a"} 2.0',
  ].join('\n');
  expect(parseServerLoad(vllm)).toEqual({ running: 9, waiting: 2 });
  expect(parseServerLoad('sglang:num_running_reqs{name="m"} 7\nsglang:num_queue_reqs{name="m"} 0\n')).toEqual({
    running: 7,
    waiting: 0,
  });
  expect(parseServerLoad('process_cpu_seconds_total 3\n')).toBeUndefined();
  // A running gauge without its waiting one tells nothing about a queue.
  expect(parseServerLoad('prime_inference_running_sequences 2\n')).toBeUndefined();
});

test('a restarted producer resumes after the highest stored draw, though groups finish out of order', () => {
  // A producer with `cap` groups in flight, each finishing at a random later moment; it is killed
  // after every stored group in turn. The draws it resumes with must all be new.
  const cap = 4;
  let seed = 7;
  const random = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  const stored: number[] = []; // draw of group seq i
  const inFlight: number[] = [];
  let nextDraw = 0;
  let outOfOrder = 0;
  while (stored.length < 200) {
    while (inFlight.length < cap) inFlight.push(nextDraw++);
    const [draw] = inFlight.splice(Math.floor(random() * inFlight.length), 1);
    stored.push(draw);
    const known = stored.map((_, seq) => seq);
    const resumed = resumeDraw(known, cap, (seq) => stored[seq]);
    expect(resumed).toBe(Math.max(...stored) + 1);
    if (stored[stored.length - 1] + 1 < resumed) outOfOrder++;
  }
  // The newest group often did not hold the highest draw: resuming after it would replay examples.
  expect(outOfOrder).toBeGreaterThan(20);
  expect(resumeDraw([], cap, () => undefined)).toBe(0);
});
