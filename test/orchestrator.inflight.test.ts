/** In-flight mode's decisions (lib/orchestrator/inflight.ts): which groups a step takes, and the producer's concurrency. */
import { difficultyFilter } from '../lib/orchestrator/filters';
import {
  claimMetrics,
  claimStep,
  nextConcurrency,
  resumeDraw,
  STALE,
  type ClaimCandidate,
} from '../lib/orchestrator/inflight';

type R = { reward: number };
/** Group `seq` of two rollouts sampled with `versions` (-1: none sampled), rewards 0 and `spread`. */
const group = (seq: number, versions: [number, number], spread = 1, idleSeconds = 0): ClaimCandidate<R> => ({
  seq,
  rollouts: versions.map((policyVersion, i) => ({ policyVersion, reward: i * spread })),
  startVersion: 4,
  idleSeconds,
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
    group(6, [8, 9]),
    group(7, [9, 9], 0), // no reward spread: the difficulty filter drops it
    group(8, [-1, 10]), // a rollout that sampled nothing does not make it old
    group(9, [10, 10]), // not needed: left for the next step
  ];
  const d = claimStep(10, groups, opts);
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
    staleGroups: 1,
    staleRollouts: 2,
    // 10-8, 10-9 and 10-10: the rollout that sampled nothing has no distance
    offPolicyMean: 1,
    offPolicyMax: 2,
    inferenceIdleSeconds: 0,
  });
  expect(filter).toEqual({
    groups_generated: 3,
    groups_dropped: 1,
    dropped_by: { 'difficulty/reward_variance': 1 },
    refill_rounds: 0,
    groups_missing: 0,
  });
  // The same groups give the same claim (a retried claim); too few leave it incomplete.
  expect(claimStep(10, groups, opts)).toEqual(d);
  expect(claimStep(10, groups.slice(0, 3), opts).complete).toBe(false);
});

test('the bound is inclusive: a group exactly max_off_policy_steps behind is taken', () => {
  expect(claimStep(10, [group(0, [8, 8]), group(1, [8, 9])], opts).kept).toHaveLength(2);
});

test('concurrency grows while the next step would wait, shrinks while groups pile up, within [1, cap]', () => {
  expect(nextConcurrency(2, 0, 4, 8)).toBe(3);
  expect(nextConcurrency(8, 0, 4, 8)).toBe(8);
  expect(nextConcurrency(3, 6, 4, 8)).toBe(2);
  expect(nextConcurrency(1, 6, 4, 8)).toBe(1);
  expect(nextConcurrency(3, 4, 4, 8)).toBe(3);
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
