/** Plugin estimators and rollout filters loaded from modules, start-up validation, and the refill of filtered steps. */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { MockActivityEnvironment } from '@temporalio/testing';
import { prepareRun } from '../../activities/run';
import { rlSchema } from '../../lib/config/schemas';
import { computeAdvantages, groupAdvantages, type AdvantageGroup } from '../../lib/orchestrator/advantages';
import { playFiltered, refillDraws, type FilterGroup } from '../../lib/orchestrator/filters';
import {
  advantageEstimator,
  isPluginError,
  rolloutFilters,
  type AdvantageConfig,
} from '../../lib/orchestrator/plugins';
import { scratchDir, tinyModel, workflowRlConfig } from '../support/setup';

const { dir: root, file } = scratchDir('prime-plugins-');

/** Writes a module under the temp folder; returns its path relative to the working directory, as a user writes it. */
const plugin = (name: string, source: string): string => './' + path.relative(process.cwd(), file(name, source));

const ADV = plugin(
  'my_adv.ts',
  `export function advantage(group: { rewards: number[] }, kwargs: { scale: number }): number[] {
     return group.rewards.map((r) => kwargs.scale * r);
   }`,
);
const FILTER = plugin(
  'my_filter.ts',
  `// Drops the groups of the step's own examples below kwargs.below (as a reason), keeps refills.
   export default (g: { group: number; round: number }, kwargs: { below: number }) => (g.round === 0 && g.group < kwargs.below ? 'early' : true);`,
);
const NO_EXPORT = plugin('nothing.ts', 'export const x = 1;\n');
const THROWS = plugin('throws.ts', "export function filter() { throw new Error('boom'); }\n");
const WRONG = plugin('wrong.ts', 'export const advantage = (g: { rewards: number[] }) => g.rewards.slice(1);\n');

const group = (rewards: number[]): AdvantageGroup => ({
  rewards,
  completionTokens: rewards.map(() => 1),
  inputTokens: rewards.map(() => 0),
  turns: rewards.map(() => 1),
});
const view = (g: Partial<FilterGroup>): FilterGroup => ({
  env: 'e',
  exampleIndex: 0,
  group: 0,
  round: 0,
  rewards: [1, 0],
  completionTokens: [1, 1],
  errored: 0,
  ...g,
});
const pluginAdvantage = (import_path: string, kwargs: Record<string, unknown> = {}): AdvantageConfig => ({
  import_path,
  kwargs,
  std_norm: false,
});
const noDifficulty = { enabled: false, min_reward_variance: 0 };

describe('plugins', () => {
  test('an estimator from a TypeScript module gets the group and its kwargs, and looks like a built-in to the caller', () => {
    const est = advantageEstimator(pluginAdvantage(ADV, { scale: 2 }));
    expect(est.name).toBe(ADV);
    expect(groupAdvantages(est, group([1, 0, 0.5]))).toEqual([2, 0, 1]);
    const r = computeAdvantages(
      [
        [
          { reward: 1, completionTokens: 3 },
          { reward: 0, completionTokens: 4 },
        ],
      ],
      est,
      { dropZeroAdvantage: true },
    );
    expect(r.advantages).toEqual([[2, null]]);
    expect(r.metrics.zero_advantage_tokens).toBe(4);
  });

  test('a rollout filter from a module: true keeps, a string drops with that reason; it runs after the difficulty filter', () => {
    const filters = rolloutFilters({
      difficulty_filter: { enabled: true, min_reward_variance: 0 },
      rollout_filters: [{ import_path: FILTER, kwargs: { below: 2 } }],
    });
    expect(filters.map((f) => f.name)).toEqual(['difficulty', FILTER]);
    expect(filters[1].check(view({ group: 1 }))).toBe('early');
    expect(filters[1].check(view({ group: 2 }))).toBeUndefined();
    expect(filters[1].check(view({ group: 1, round: 1 }))).toBeUndefined();
  });

  test('bad modules fail with an error naming the key and the module', () => {
    const load = (p: string) => () => advantageEstimator(pluginAdvantage(p));
    expect(load('./no/such/adv.ts')).toThrow(
      `orchestrator.advantage.import_path = "./no/such/adv.ts": module ${path.resolve('no/such/adv.ts')} not found`,
    );
    expect(load('no-such-package-xyz')).toThrow(
      'orchestrator.advantage.import_path = "no-such-package-xyz": no such module path (./file.ts) or installed npm package',
    );
    expect(load(NO_EXPORT)).toThrow(
      `orchestrator.advantage.import_path = "${NO_EXPORT}": the module exports no advantage estimator (a function exported as \`advantage\` or as the default)`,
    );
    expect(() =>
      rolloutFilters({
        difficulty_filter: noDifficulty,
        rollout_filters: [
          { import_path: FILTER, kwargs: {} },
          { import_path: './gone.ts', kwargs: {} },
        ],
      }),
    ).toThrow(/^orchestrator\.rollout_filters\[1\]\.import_path = "\.\/gone\.ts": module .*gone\.ts not found$/);
  });

  test('a plugin that throws or returns the wrong shape is a PluginError naming it', () => {
    const wrong = advantageEstimator(pluginAdvantage(WRONG));
    const e1 = (() => {
      try {
        wrong.compute(group([1, 0]));
      } catch (e) {
        return e;
      }
    })();
    expect(isPluginError(e1)).toBe(true);
    expect((e1 as Error).message).toBe(
      `advantage estimator "${WRONG}" returned 1 values [0] for a group of 2 rollouts: it must return 2 finite numbers`,
    );
    const [, throws] = rolloutFilters({
      difficulty_filter: noDifficulty,
      rollout_filters: [{ import_path: THROWS, kwargs: {} }],
    });
    expect(() => throws.check(view({}))).toThrow(`rollout filter "${THROWS}" threw: boom`);
  });

  test('the config takes a built-in or a plugin, not both', () => {
    const parse = (advantage: Record<string, unknown>) =>
      rlSchema.safeParse({
        trainer: { model: { name: 'm' } },
        inference: { model: { name: 'm' } },
        orchestrator: { model: { name: 'm' }, advantage },
      });
    const ok = parse({ import_path: ADV, kwargs: { scale: 2 } });
    expect(ok.success && ok.data.orchestrator.advantage).toEqual({
      import_path: ADV,
      kwargs: { scale: 2 },
      std_norm: false,
    });
    const both = parse({ import_path: ADV, type: 'rloo' });
    expect(both.success).toBe(false);
    expect(!both.success && both.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`)).toEqual([
      'orchestrator.advantage.type: set either type (a built-in) or import_path (a plugin estimator, which computes the advantages itself), not both',
    ]);
    const stray = parse({ kwargs: { scale: 2 } });
    expect(!stray.success && stray.error.issues.map((i) => i.path.join('.'))).toEqual([
      'orchestrator.advantage.kwargs',
    ]);
  });

  test('prepareRun loads the plugins: a bad import_path fails the start, non-retryably, naming the module', async () => {
    const modelDir = tinyModel(path.join(root, 'model'));
    const config = (orchestrator: Record<string, unknown>) =>
      workflowRlConfig('p', modelDir, path.join(root, 'runs'), orchestrator);
    const mock = new MockActivityEnvironment();
    const e = await mock.run(prepareRun, config({ rollout_filters: [{ import_path: './missing_filter.ts' }] })).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(e).toBeInstanceOf(ApplicationFailure);
    expect((e as ApplicationFailure).nonRetryable).toBe(true);
    expect((e as ApplicationFailure).type).toBe('InvalidConfig');
    expect((e as ApplicationFailure).message).toBe(
      `orchestrator.rollout_filters[0].import_path = "./missing_filter.ts": module ${path.resolve('missing_filter.ts')} not found`,
    );
    expect(fs.existsSync(path.join(root, 'runs', 'p'))).toBe(false);
    // Good plugins pass.
    await mock.run(
      prepareRun,
      config({ advantage: { import_path: ADV, kwargs: { scale: 1 } }, rollout_filters: [{ import_path: FILTER }] }),
    );
  });
});

describe('refill', () => {
  const entries = [
    { weight: 1, size: 50 },
    { weight: 1, size: null },
  ];

  test('refill draws are a pure function of (seed, step, round, count), a stream of their own', () => {
    const a = refillDraws(entries, { seed: 3, examplesPerStep: 4, maxRefillRounds: 2 });
    const b = refillDraws(entries, { seed: 3, examplesPerStep: 4, maxRefillRounds: 2 });
    expect(b(7, 2, 3)).toEqual(a(7, 2, 3));
    expect(a(7, 2, 2)).toEqual(a(7, 2, 3).slice(0, 2));
    expect(a(7, 1, 4)).not.toEqual(a(7, 2, 4));
    expect(() => a(7, 3, 1)).toThrow(/refill round 3 is outside 1\.\.2/);
  });

  /** Groups of one number each (their slot); the filter drops the slots in `drop`. */
  async function run(drop: (slot: number) => boolean, maxRefillRounds: number) {
    const plays: [number, number, number][] = [];
    const r = await playFiltered<number>({
      groups: 4,
      maxRefillRounds,
      filters: [{ name: 'odd', check: (g) => (drop(g.group) ? 'yes' : undefined) }],
      play: async (round, first, count) => (
        plays.push([round, first, count]),
        Array.from({ length: count }, (_, i) => first + i)
      ),
      view: (slot) => view({ group: slot }),
    });
    return { ...r, plays };
  }

  test('dropped groups are replaced by fresh ones until the step is full', async () => {
    // Slots 1 and 3 dropped; the refill plays slots 4 and 5, of which 5 is dropped; then slot 6.
    const r = await run((s) => s % 2 === 1, 4);
    expect(r.plays).toEqual([
      [0, 0, 4],
      [1, 4, 2],
      [2, 6, 1],
    ]);
    expect(r.kept).toEqual([0, 2, 4, 6]);
    expect(r.dropped).toEqual([
      { group: 1, reason: 'odd/yes' },
      { group: 3, reason: 'odd/yes' },
      { group: 5, reason: 'odd/yes' },
    ]);
    expect(r.metrics).toEqual({
      groups_generated: 7,
      groups_dropped: 3,
      dropped_by: { 'odd/yes': 3 },
      refill_rounds: 2,
      groups_missing: 0,
    });
  });

  test('refills are bounded: after max_refill_rounds the step trains on what it has', async () => {
    const r = await run(() => true, 2);
    expect(r.plays).toEqual([
      [0, 0, 4],
      [1, 4, 4],
      [2, 8, 4],
    ]);
    expect(r.kept).toEqual([]);
    expect(r.metrics).toEqual({
      groups_generated: 12,
      groups_dropped: 12,
      dropped_by: { 'odd/yes': 12 },
      refill_rounds: 2,
      groups_missing: 4,
    });
    const none = await run(() => false, 2);
    expect(none.plays).toEqual([[0, 0, 4]]);
    expect(none.metrics.refill_rounds).toBe(0);
  });
});
