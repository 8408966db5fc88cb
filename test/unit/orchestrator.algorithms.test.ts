/**
 * prime-rl's algorithms as our units, each against a hand-computed case (docs/algorithms.md): rae's
 * baselines, echo's observation weights, the packing of sft distillation, echo and rae per
 * environment, the admission gates, opsd's demonstration, and SFT from several sources by ratio.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { raeAdvantages } from '../../lib/orchestrator/advantages';
import { echoWeights } from '../../lib/orchestrator/echo';
import { gateFilter } from '../../lib/orchestrator/plugins';
import { demonstration, hintTokens, missingDemonstration } from '../../lib/orchestrator/self-distill';
import { buildStepBatch, type EnvAlgorithm } from '../../lib/orchestrator/step-batch';
import { readBatch } from '../../lib/runfolder/batch';
import type { TokenSegment } from '../../lib/runfolder/packing';
import { SftMixSchedule } from '../../lib/sft/schedule';
import { Tokenizer } from '../../lib/model/tokenizer';
import { tinyModel } from '../support/setup';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'algorithms-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

test("rae: each trace against its key's EMA baseline before its reward moves it", () => {
  const baselines: Record<string, number> = {};
  const adv = raeAdvantages(
    [
      { key: 'e/A', reward: 1 },
      { key: 'e/A', reward: 0 },
      { key: 'e/B', reward: 1 },
      { key: 'e/A', reward: 1 },
    ],
    baselines,
    0.5,
  );
  // A: 1 - 0 (b -> 0.5), 0 - 0.5 (b -> 0.25), B: 1 - 0 (b -> 0.5), A: 1 - 0.25 (b -> 0.625).
  expect(adv).toEqual([1, -0.5, 1, 0.75]);
  expect(baselines).toEqual({ 'e/A': 0.625, 'e/B': 0.5 });
  expect(() => raeAdvantages([], {}, 1)).toThrow(/decay must be in \[0, 1\)/);
});

/** prompt (system + user), answer, observation (user, then tool), answer, observation (tool). */
const episode = (): TokenSegment[] => [
  {
    tokens: [1, 2, 3],
    generated: false,
    roles: [
      { role: 'system', tokens: 1 },
      { role: 'user', tokens: 2 },
    ],
  },
  { tokens: [4, 5], generated: true, logprobs: [-1, -1] },
  {
    tokens: [6, 7, 8, 9],
    generated: false,
    roles: [
      { role: 'user', tokens: 3 },
      { role: 'tool', tokens: 1 },
    ],
  },
  { tokens: [10], generated: true, logprobs: [-1] },
  { tokens: [11, 12], generated: false, roles: [{ role: 'tool', tokens: 2 }] },
];

test("echo: the observation tokens after the first answer weigh their role's weight; the prompt and answers none", () => {
  expect(Array.from(echoWeights(episode(), { user: 0.5, tool: 0.1 }))).toEqual(
    [0, 0, 0, 0, 0, 0.5, 0.5, 0.5, 0.1, 0, 0.1, 0.1].map((w) => Math.fround(w)),
  );
  // Roles not chosen, and spans of unknown role, weigh nothing.
  expect(Array.from(echoWeights(episode(), { system: 1 })).every((w) => w === 0)).toBe(true);
});

describe("packing by each environment's algorithm", () => {
  const rollout = (env: number, group: number, reward: number, extra: object = {}) => ({
    env: `env${env}`,
    envIndex: env,
    group,
    reward,
    completionTokens: 3,
    turns: 2,
    samples: [episode()],
    ...extra,
  });
  /** Each packed sample's loss mask, advantages and ce weights, and the batch's counts. */
  const packed = (file: string) => {
    const samples: { mask: number[]; adv: number[]; ce: number[] }[] = [];
    const batch = readBatch(file);
    for (const row of batch.rows) {
      let at = 0;
      for (const len of row.sampleLengths) {
        const span = (a: ArrayLike<number>) => Array.from(a).slice(at, at + len);
        samples.push({
          mask: span(row.lossMask),
          adv: span(row.advantages),
          ce: row.ceWeights ? span(row.ceWeights) : [],
        });
        at += len;
      }
    }
    return { samples, counts: batch.counts };
  };
  const sorted = (xs: number[]) => [...xs].sort((a, b) => a - b);
  const envs: EnvAlgorithm[] = [
    { id: 'env0', advantage: { type: 'grpo', std_norm: false, kwargs: {} }, echo: { user: 0.5 } },
    {
      id: 'env1',
      advantage: { type: 'grpo', std_norm: false, kwargs: {} },
      distill: { type: 'sft', weight: 0, baseline: 'none' },
    },
    { id: 'env2', advantage: { type: 'rae', decay: 0.5, std_norm: false, kwargs: {} } },
  ];
  const write = (name: string, lines: object[]) => {
    const file = path.join(dir, `${name}.jsonl`);
    fs.writeFileSync(file, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
    return file;
  };

  test('echo: the policy on the answers (grpo), cross-entropy on the chosen observations; a zero advantage trains only those', () => {
    const batchFile = path.join(dir, 'echo.safetensors');
    const r = buildStepBatch({
      step: 0,
      rolloutsFile: write('echo', [rollout(0, 0, 1), rollout(0, 0, 0), rollout(0, 1, 0.5), rollout(0, 1, 0.5)]),
      batchFile,
      seqLen: 12,
      advantage: envs[0].advantage,
      filterZeroAdvantages: true,
      envs: [envs[0]],
    });
    expect(r.advantages).toMatchObject({ groups: 2, rollouts: 4 });
    const { samples, counts } = packed(batchFile);
    expect(samples).toHaveLength(4); // all four: group 1's have no policy signal but echo tokens
    const ce = [0, 0, 0, 0, 0, 0.5, 0.5, 0.5, 0, 0, 0, 0];
    const byAdv = (a: number) => samples.filter((s) => s.adv[3] === a);
    // Group 0: +0.5 and -0.5 on the three answer tokens.
    for (const a of [0.5, -0.5]) {
      expect(byAdv(a)).toHaveLength(1);
      expect(byAdv(a)[0].mask).toEqual([0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0]);
      expect(byAdv(a)[0].ce).toEqual(ce);
    }
    // Group 1 (equal rewards): no policy tokens, the echo tokens stay.
    for (const s of byAdv(0)) expect([s.mask.every((m) => m === 0), s.ce]).toEqual([true, ce]);
    expect(counts.ceTokens).toBe(4 * 3);
  });

  test('sft distillation: cross-entropy on every token the teacher sampled, no policy term, whatever the rewards', () => {
    const batchFile = path.join(dir, 'sft.safetensors');
    buildStepBatch({
      step: 0,
      rolloutsFile: write('sft', [rollout(1, 0, 1, { teacher: true }), rollout(1, 0, 1, { teacher: true })]),
      batchFile,
      seqLen: 12,
      advantage: envs[1].advantage,
      filterZeroAdvantages: true,
      envs: [envs[0], envs[1]],
    });
    const { samples, counts } = packed(batchFile);
    expect(samples).toHaveLength(2);
    for (const s of samples) {
      expect(s.mask.every((m) => m === 0)).toBe(true);
      expect(s.ce).toEqual([0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0]);
    }
    expect([counts.lossTokens, counts.ceTokens]).toEqual([0, 6]);
  });

  test("rae: groups of one, each rollout against its environment's agent baseline, carried from step to step in the run folder", () => {
    const state = (s: number) => path.join(dir, `rae_${s}.json`);
    const step = (s: number, rewards: number[]) =>
      buildStepBatch({
        step: s,
        rolloutsFile: write(
          `rae${s}`,
          rewards.map((r, g) => rollout(2, g, r)),
        ),
        batchFile: path.join(dir, `rae${s}.safetensors`),
        seqLen: 12,
        advantage: envs[2].advantage,
        filterZeroAdvantages: false,
        envs,
        rae: { ...(s > 0 ? { before: state(s - 1) } : {}), after: state(s) },
      });
    // Step 0: 1 - 0 = 1 (b 0.5), 0 - 0.5 = -0.5 (b 0.25). Step 1: 1 - 0.25 = 0.75 (b 0.625).
    expect(step(0, [1, 0]).rae).toEqual({ '2/agent': 0.25 });
    expect(sorted(packed(path.join(dir, 'rae0.safetensors')).samples.map((x) => x.adv[3]))).toEqual([-0.5, 1]);
    expect(step(1, [1]).rae).toEqual({ '2/agent': 0.625 });
    expect(packed(path.join(dir, 'rae1.safetensors')).samples.map((x) => x.adv[3])).toEqual([0.75]);
    // A multi-agent episode: each trace against its own agent's baseline.
    const traces = [
      { agent: 'p0', reward: 1, samples: 1 },
      { agent: 'p1', reward: -1, samples: 1 },
    ];
    const r = buildStepBatch({
      step: 0,
      rolloutsFile: write('rae-agents', [rollout(2, 0, 0, { samples: [episode(), episode()], traces })]),
      batchFile: path.join(dir, 'rae-agents.safetensors'),
      seqLen: 24,
      advantage: envs[2].advantage,
      filterZeroAdvantages: false,
      envs,
      rae: { after: path.join(dir, 'rae-agents.json') },
    });
    expect(r.rae).toEqual({ '2/p0': 0.5, '2/p1': -0.5 });
    expect(sorted(packed(path.join(dir, 'rae-agents.safetensors')).samples.map((x) => x.adv[3]))).toEqual([-1, 1]);
  });
});

test('admission gates: advantage_range drops a group whose advantages all lie in the range, per environment', () => {
  const gate = gateFilter([
    { gates: {}, advantage: { type: 'grpo', std_norm: false, kwargs: {} }, distills: false },
    {
      gates: { zero_advantage: { type: 'advantage_range', reject_min: 0, reject_max: 0 } },
      advantage: { type: 'grpo', std_norm: false, kwargs: {} },
      distills: false,
    },
  ])!;
  const group = (envIndex: number, rewards: number[]) => ({
    env: 'e',
    envIndex,
    exampleIndex: 0,
    group: 0,
    round: 0,
    rewards,
    completionTokens: rewards.map(() => 1),
    errored: 0,
  });
  expect(gate.check(group(1, [1, 1]))).toBe('zero_advantage'); // advantages [0, 0]
  expect(gate.check(group(1, [1, 0]))).toBeUndefined(); // [0.5, -0.5]
  expect(gate.check(group(0, [1, 1]))).toBeUndefined(); // no gates on env 0
  expect(gate.check(group(1, [1]))).toBeUndefined(); // one valid rollout: no advantages, admitted
  expect(
    gateFilter([{ gates: {}, advantage: { type: 'grpo', std_norm: false, kwargs: {} }, distills: false }]),
  ).toBeUndefined();
});

test("opsd: the demonstration from the example's info, its verifiers task, or the example; its system message's tokens", () => {
  const example = { prompt: [], answer: 'cba', info: { hint: 'x', task_data: { demonstration: 'shown' } } };
  expect(demonstration(example, 'answer')).toBe('cba');
  expect(demonstration(example, 'hint')).toBe('x');
  expect(demonstration(example, 'demonstration')).toBe('shown');
  expect(demonstration(example, 'nope')).toBeUndefined();
  expect(missingDemonstration('nope', 'env', 3, example)).toBe(
    'distill.demo_key = "nope": example 3 of env has no such field holding text (it has: hint, task_data, demonstration, answer); name the field that holds the demonstration',
  );
  const tokenizer = Tokenizer.fromDir(tinyModel(path.join(dir, 'model')));
  const ids = hintTokens(tokenizer, 'Expert: {demonstration}.', 'cba');
  expect(tokenizer.decode(ids)).toBe('<|im_start|>system\nExpert: cba.<|im_end|>\n');
});

test('SFT from several sources: each batch takes each source its share by ratio, each source its own shuffled epochs', () => {
  /** A schedule of one epoch of sources of these sizes and ratios. */
  const mix = (sizes: number[], ratios: number[], batchSize: number, seed: number) =>
    new SftMixSchedule({ sources: sizes.map((size, i) => ({ size, ratio: ratios[i] })), batchSize, epochs: 1, seed });
  const s = mix([6, 2], [3, 1], 4, 0);
  // Shares 0.75 and 0.25: slots go 0, 0, 1, 0 (smooth weighted round robin); one epoch of each
  // takes 8 slots (6 / 0.75 and 2 / 0.25): 2 steps.
  expect(s.totalSteps).toBe(2);
  const steps = [s.batch(0), s.batch(1)];
  for (const b of steps) expect(b.map((x) => x.source)).toEqual([0, 0, 1, 0]);
  const of = (source: number) =>
    steps
      .flat()
      .filter((x) => x.source === source)
      .map((x) => x.index);
  expect(of(0).sort((a, b) => a - b)).toEqual([0, 1, 2, 3, 4, 5]);
  expect(of(1).sort((a, b) => a - b)).toEqual([0, 1]);
  // A pure function of the step: a resumed run sees the same batches.
  const again = mix([6, 2], [3, 1], 4, 0);
  expect(again.batch(1)).toEqual(steps[1]);
  // The small source goes round again while the big one finishes its epochs (all exhausted).
  const long = mix([10, 2], [1, 1], 2, 1);
  expect(long.totalSteps).toBe(10);
  expect(() => mix([3], [0], 2, 0)).toThrow(/ratio 0, not > 0/);
});
