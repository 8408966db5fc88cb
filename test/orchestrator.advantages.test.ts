/** Group advantages and difficulty filtering against hand-computed values. */
import { computeAdvantages, groupAdvantages, sampleStd, type RolloutOutcome } from '../lib/orchestrator/advantages';

const grpo = { type: 'grpo' as const, std_norm: false };
const rollouts = (rewards: (number | 'err')[], len = 10): RolloutOutcome[] =>
  rewards.map((r) => (r === 'err' ? { reward: NaN, completionTokens: len, errored: true } : { reward: r, completionTokens: len }));

function expectClose(actual: readonly (number | null)[], expected: readonly (number | null)[]) {
  expect(actual).toHaveLength(expected.length);
  actual.forEach((a, i) => {
    if (expected[i] === null) expect(a).toBeNull();
    else expect(a).toBeCloseTo(expected[i]!, 12);
  });
}

describe('groupAdvantages', () => {
  const R = [1, 0, 0.5, 0.5];
  const L = [10, 10, 10, 10];

  test('grpo: R - mean(R)', () => {
    expectClose(groupAdvantages(R, L, grpo), [0.5, -0.5, 0, 0]);
  });

  test('std_norm divides by the sample std (n - 1, as torch.std()) + 1e-8', () => {
    // deviations^2 sum to 0.5; / (4 - 1) = 1/6
    expect(sampleStd(R)).toBeCloseTo(Math.sqrt(1 / 6), 15);
    const s = Math.sqrt(1 / 6) + 1e-8;
    expectClose(groupAdvantages(R, L, { type: 'grpo', std_norm: true }), [0.5 / s, -0.5 / s, 0, 0]);
    expectClose(groupAdvantages(R, L, { type: 'rloo', std_norm: true }), [2 / 3 / s, -2 / 3 / s, 0, 0]);
  });

  test('rloo: R_i - mean of the others', () => {
    // 1 - (0 + .5 + .5) / 3, 0 - (1 + .5 + .5) / 3, .5 - (1 + 0 + .5) / 3
    expectClose(groupAdvantages(R, L, { type: 'rloo', std_norm: false }), [2 / 3, -2 / 3, 0, 0]);
    expectClose(groupAdvantages([3, 1], [1, 1], { type: 'rloo', std_norm: false }), [2, -2]);
  });

  test('opo: length-weighted baseline sum(|o| R) / sum(|o|)', () => {
    expectClose(groupAdvantages([1, 0], [10, 30], { type: 'opo', std_norm: false }), [0.75, -0.25]);
    expectClose(groupAdvantages([1, 0, 1], [2, 4, 4], { type: 'opo', std_norm: false }), [0.4, -0.6, 0.4]);
    // Every completion empty: no length to weight by, the plain mean is the baseline.
    expectClose(groupAdvantages([1, 0], [0, 0], { type: 'opo', std_norm: false }), [0.5, -0.5]);
  });

  test('needs two rollouts', () => {
    expect(() => groupAdvantages([1], [1], grpo)).toThrow(/at least 2/);
  });
});

describe('computeAdvantages with filtering', () => {
  const filter = { zero_variance: true, min_reward: 0.2, max_reward: 0.9 };
  const groups = [
    rollouts([1, 0, 1, 0]), // kept
    rollouts([1, 1, 1, 1]), // all equal
    rollouts(['err', 0.5, 'err']), // one valid rollout left
    rollouts([0.1, 0.2]), // mean 0.15 < 0.2
    rollouts([0.9, 1.0]), // mean 0.95 > 0.9
    rollouts([1, 'err', 0, 0.5]), // kept with 3 valid rollouts
    rollouts(['err', 'err']), // nothing valid
  ];

  test('advantages of kept groups, null for everything not trained on', () => {
    const r = computeAdvantages(groups, { advantage: grpo, filter });
    expect(r.verdicts).toEqual(['kept', 'zero_variance', 'too_few_valid', 'below_min_reward', 'above_max_reward', 'kept', 'too_few_valid']);
    expectClose(r.advantages[0], [0.5, -0.5, 0.5, -0.5]);
    expectClose(r.advantages[5], [0.5, null, -0.5, 0]);
    for (const g of [1, 2, 3, 4, 6]) expect(r.advantages[g].every((a) => a === null)).toBe(true);
    expect(r.metrics).toEqual({
      groups: 7,
      groups_kept: 2,
      rollouts: 21,
      rollouts_errored: 5,
      rollouts_kept: 7,
      filtered: { too_few_valid: 2, zero_variance: 1, below_min_reward: 1, above_max_reward: 1 },
    });
  });

  test('filters are optional: all-equal groups train with zero advantage when zero_variance is off', () => {
    const r = computeAdvantages([rollouts([1, 1]), rollouts([0.1, 0.2])], { advantage: grpo, filter: { zero_variance: false } });
    expect(r.verdicts).toEqual(['kept', 'kept']);
    expectClose(r.advantages[0], [0, 0]);
    expectClose(r.advantages[1], [-0.05, 0.05]);
  });

  test('an all-equal group is counted as zero variance, not as out of range', () => {
    const r = computeAdvantages([rollouts([0, 0, 0])], { advantage: grpo, filter });
    expect(r.metrics.filtered).toEqual({ too_few_valid: 0, zero_variance: 1, below_min_reward: 0, above_max_reward: 0 });
  });

  test('a non-finite reward must be marked errored', () => {
    expect(() => computeAdvantages([[{ reward: NaN, completionTokens: 1 }, { reward: 1, completionTokens: 1 }]], { advantage: grpo, filter })).toThrow(
      /reward NaN of a rollout not marked errored/,
    );
  });
});
