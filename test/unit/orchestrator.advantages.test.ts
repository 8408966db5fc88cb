/** Advantage estimators, zero-advantage dropping and the difficulty filter against hand-computed values. */
import { ADVANTAGE_TYPES } from '../../lib/config/names';
import {
  BUILTIN_ADVANTAGES,
  builtinEstimator,
  computeAdvantages,
  groupAdvantages,
  sampleStd,
  type AdvantageGroup,
  type BuiltinAdvantageConfig,
  type RolloutOutcome,
} from '../../lib/orchestrator/advantages';
import { difficultyFilter, dropReason, rewardVariance, type FilterGroup } from '../../lib/orchestrator/filters';
import { rlSchema } from '../../lib/config/schemas';

/** The rl config with this orchestrator section (model names filled in). */
const orchestrator = (o: Record<string, unknown> = {}) =>
  rlSchema.parse({
    trainer: { model: { name: 'm' } },
    inference: { model: { name: 'm' } },
    orchestrator: { model: { name: 'm' }, ...o },
  }).orchestrator;
/** The config errors of this orchestrator section, as `dotted.path: message`. */
function configErrors(o: Record<string, unknown>): string {
  const r = rlSchema.safeParse({
    trainer: { model: { name: 'm' } },
    inference: { model: { name: 'm' } },
    orchestrator: { model: { name: 'm' }, ...o },
  });
  if (r.success) throw new Error('the config parsed');
  return r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('\n');
}

const grpo = builtinEstimator({ type: 'grpo', std_norm: false });
const rollouts = (rewards: (number | 'err')[], len = 10): RolloutOutcome[] =>
  rewards.map((r) =>
    r === 'err' ? { reward: NaN, completionTokens: len, errored: true } : { reward: r, completionTokens: len },
  );

function expectClose(actual: readonly (number | null)[], expected: readonly (number | null)[]) {
  expect(actual).toHaveLength(expected.length);
  actual.forEach((a, i) => {
    if (expected[i] === null) expect(a).toBeNull();
    else expect(a).toBeCloseTo(expected[i]!, 12);
  });
}

/** A group with these rewards and completion lengths; no input tokens, one turn each. */
const group = (
  rewards: number[],
  lengths = rewards.map(() => 10),
  extra: Partial<AdvantageGroup> = {},
): AdvantageGroup => ({
  rewards,
  completionTokens: lengths,
  inputTokens: rewards.map(() => 0),
  turns: rewards.map(() => 1),
  ...extra,
});
const adv = (cfg: BuiltinAdvantageConfig, g: AdvantageGroup) => groupAdvantages(builtinEstimator(cfg), g);

describe('built-in estimators', () => {
  const R = [1, 0, 0.5, 0.5];

  test('the config names each built-in once; the registry implements those names', () => {
    expect(ADVANTAGE_TYPES).toEqual(Object.keys(BUILTIN_ADVANTAGES));
    expect(ADVANTAGE_TYPES).toEqual(['grpo', 'rloo', 'opo', 'max_rl']);
    expect(orchestrator().advantage.type).toBe('grpo');
    expect(configErrors({ advantage: { type: 'ppo' } })).toMatch(
      /^orchestrator\.advantage\.type: .*grpo.*rloo.*opo.*max_rl/,
    );
  });

  test('grpo: R - mean(R)', () => {
    expectClose(adv({ type: 'grpo', std_norm: false }, group(R)), [0.5, -0.5, 0, 0]);
  });

  test('std_norm divides by the sample std (n - 1, as torch.std()) + 1e-8', () => {
    // deviations^2 sum to 0.5; / (4 - 1) = 1/6
    expect(sampleStd(R)).toBeCloseTo(Math.sqrt(1 / 6), 15);
    const s = Math.sqrt(1 / 6) + 1e-8;
    expectClose(adv({ type: 'grpo', std_norm: true }, group(R)), [0.5 / s, -0.5 / s, 0, 0]);
    expectClose(adv({ type: 'rloo', std_norm: true }, group(R)), [2 / 3 / s, -2 / 3 / s, 0, 0]);
  });

  test('rloo: R_i - mean of the others', () => {
    // 1 - (0 + .5 + .5) / 3, 0 - (1 + .5 + .5) / 3, .5 - (1 + 0 + .5) / 3
    expectClose(adv({ type: 'rloo', std_norm: false }, group(R)), [2 / 3, -2 / 3, 0, 0]);
    expectClose(adv({ type: 'rloo', std_norm: false }, group([3, 1])), [2, -2]);
  });

  test('opo: length-weighted baseline sum(|o| R) / sum(|o|)', () => {
    const opo = { type: 'opo' as const, std_norm: false };
    expectClose(adv(opo, group([1, 0], [10, 30])), [0.75, -0.25]);
    expectClose(adv(opo, group([1, 0, 1], [2, 4, 4])), [0.4, -0.6, 0.4]);
    // Every completion empty: no length to weight by, the plain mean is the baseline.
    expectClose(adv(opo, group([1, 0], [0, 0])), [0.5, -0.5]);
  });

  test('max_rl: (R - mean) / mean, and 0 for every rollout when the mean is 0', () => {
    const maxRl = { type: 'max_rl' as const, std_norm: false };
    // mean 0.25: (1 - .25) / .25 = 3, (0 - .25) / .25 = -1
    expectClose(adv(maxRl, group([1, 0, 0, 0])), [3, -1, -1, -1]);
    // mean 0.5: 1, -1
    expectClose(adv(maxRl, group([1, 0])), [1, -1]);
    expectClose(adv(maxRl, group([0, 0, 0])), [0, 0, 0]);
    expect(configErrors({ advantage: { type: 'max_rl', std_norm: true } })).toBe(
      'orchestrator.advantage.std_norm: max_rl normalises by the group mean: std_norm must stay false',
    );
  });

  test('linear length penalty: R_i - mean(R) * (w_out out_i/max out + w_in in_i/max in + w_turns turns_i/max turns), then the estimator', () => {
    const penalty = {
      type: 'linear' as const,
      num_output_tokens_weight: 0.25,
      num_input_tokens_weight: 0.1,
      num_turns_weight: 0.1,
    };
    const g = group([1, 1, 0], [10, 20, 40], { inputTokens: [5, 10, 10], turns: [1, 2, 2] });
    // mean(R) = 2/3. Fractions: out 1/4, 1/2, 1; in 1/2, 1, 1; turns 1/2, 1, 1.
    const frac = [0.25 * 0.25 + 0.1 * 0.5 + 0.1 * 0.5, 0.25 * 0.5 + 0.1 + 0.1, 0.25 + 0.1 + 0.1];
    const shaped = [1 - (2 / 3) * frac[0], 1 - (2 / 3) * frac[1], 0 - (2 / 3) * frac[2]];
    const m = (shaped[0] + shaped[1] + shaped[2]) / 3;
    expectClose(
      adv({ type: 'grpo', std_norm: false, length_penalty: penalty }, g),
      shaped.map((s) => s - m),
    );
    // Equal rewards and equal lengths: the penalty is the same for all, so no signal.
    expectClose(adv({ type: 'grpo', std_norm: false, length_penalty: penalty }, group([1, 1])), [0, 0]);
    // The config's defaults are prime-rl's: 0.25 / 0.1 / 0.1.
    const parsed = orchestrator({ advantage: { length_penalty: {} } }).advantage;
    expect(parsed.length_penalty).toEqual(penalty);
  });

  test('needs two rollouts', () => {
    expect(() => groupAdvantages(grpo, group([1]))).toThrow(/at least 2/);
  });

  test('equal rewards give exactly 0, whatever their float value', () => {
    for (const type of ADVANTAGE_TYPES)
      expect(adv({ type, std_norm: false }, group([0.1, 0.1, 0.1])).every((a) => a === 0)).toBe(true);
  });
});

describe('computeAdvantages', () => {
  const groups = [
    rollouts([1, 0, 1, 0]), // kept
    rollouts([1, 1, 1, 1]), // all equal: zero advantages
    rollouts(['err', 0.5, 'err']), // one valid rollout left
    rollouts([1, 'err', 0, 0.5]), // kept with 3 valid rollouts, one of them at the mean
    rollouts(['err', 'err']), // nothing valid
  ];

  test('zero-advantage rollouts are dropped and counted, with their tokens', () => {
    const r = computeAdvantages(groups, grpo, { dropZeroAdvantage: true });
    expect(r.verdicts).toEqual(['kept', 'kept', 'too_few_valid', 'kept', 'too_few_valid']);
    expectClose(r.advantages[0], [0.5, -0.5, 0.5, -0.5]);
    expectClose(r.advantages[1], [null, null, null, null]);
    expectClose(r.advantages[3], [0.5, null, -0.5, null]);
    for (const g of [2, 4]) expect(r.advantages[g].every((a) => a === null)).toBe(true);
    expect(r.metrics).toEqual({
      groups: 5,
      groups_kept: 3,
      groups_too_few_valid: 2,
      rollouts: 17,
      rollouts_errored: 5,
      rollouts_kept: 6,
      zero_advantage_rollouts: 5,
      zero_advantage_tokens: 50,
    });
  });

  test('without filter_zero_advantages they train with advantage 0', () => {
    const r = computeAdvantages(groups, grpo, { dropZeroAdvantage: false });
    expectClose(r.advantages[1], [0, 0, 0, 0]);
    expectClose(r.advantages[3], [0.5, null, -0.5, 0]);
    expect(r.metrics.rollouts_kept).toBe(11);
    expect(r.metrics.zero_advantage_tokens).toBe(0);
  });

  test('a non-finite reward must be marked errored', () => {
    expect(() =>
      computeAdvantages(
        [
          [
            { reward: NaN, completionTokens: 1 },
            { reward: 1, completionTokens: 1 },
          ],
        ],
        grpo,
        { dropZeroAdvantage: true },
      ),
    ).toThrow(/reward NaN of a rollout not marked errored/);
  });
});

describe('difficulty filter', () => {
  const view = (rewards: number[]): FilterGroup => ({
    env: 'e',
    exampleIndex: 0,
    group: 0,
    round: 0,
    rewards,
    completionTokens: rewards.map(() => 1),
    errored: 0,
  });
  const filter = difficultyFilter({ enabled: true, min_reward_variance: 0.1, min_reward: 0.2, max_reward: 0.8 });

  test('population variance', () => {
    // mean 0.25; squared deviations .5625 + 3 x .0625 = .75; / 4
    expect(rewardVariance([1, 0, 0, 0])).toBeCloseTo(0.1875, 15);
  });

  test('drops groups without enough spread or with a mean outside [min_reward, max_reward], each under its first failing check', () => {
    expect(filter.check(view([1, 0, 1, 0]))).toBeUndefined(); // variance .25, mean .5
    expect(filter.check(view([1, 1, 1, 1]))).toBe('reward_variance');
    expect(filter.check(view([0.5, 0.6, 0.5, 0.6]))).toBe('reward_variance'); // variance .0025
    expect(filter.check(view([1, 0, 0, 0, 0, 0]))).toBe('min_reward'); // variance 5/36 = .139, mean 1/6
    expect(filter.check(view([1, 1, 1, 1, 1, 0]))).toBe('max_reward'); // mean 5/6
    expect(dropReason([filter], view([1, 1]))).toBe('difficulty/reward_variance');
  });

  test('groups of fewer than 2 valid rollouts are left to packing; a disabled filter keeps all', () => {
    expect(filter.check(view([1]))).toBeUndefined();
    expect(difficultyFilter({ enabled: false, min_reward_variance: 0.1 }).check(view([1, 1]))).toBeUndefined();
    // Enabled with the defaults, it drops exactly the groups of equal rewards.
    const defaults = orchestrator({ difficulty_filter: { enabled: true } }).difficulty_filter;
    expect(difficultyFilter(defaults).check(view([0, 0]))).toBe('reward_variance');
    expect(difficultyFilter(defaults).check(view([0, 0.01]))).toBeUndefined();
  });

  test('the replaced orchestrator.filter section is an error naming its replacement', () => {
    expect(configErrors({ filter: { zero_variance: false } })).toMatch(
      /^orchestrator\.filter: replaced by orchestrator\.difficulty_filter \{ enabled, min_reward_variance, min_reward, max_reward \}/,
    );
    expect(orchestrator()).not.toHaveProperty('filter');
  });
});
