/** Online distillation's teacher term and its baselines (lib/orchestrator/distill.ts). */
import { positionBaselines, teacherKl, teacherTerms } from '../../lib/orchestrator/distill';
import type { TokenSegment } from '../../lib/runfolder/packing';

/** A sample: prompt [0], then generated turns whose tokens have student logprob -1 and teacher logprob -1 + term. */
function sample(...turns: (number | null)[][]): TokenSegment[] {
  return [
    { tokens: [0], generated: false },
    ...turns.flatMap((terms): TokenSegment[] => [
      {
        tokens: terms.map(() => 1),
        generated: true,
        logprobs: terms.map(() => -1),
        teacherLogprobs: terms.map((t) => (t === null ? null : t - 1)),
      },
      { tokens: [2], generated: false }, // the environment's answer
    ]),
  ];
}

test('teacher terms run over the generated tokens of every turn, null where the teacher gave none', () => {
  expect(teacherTerms(sample([-2, 0], [null, -0.5]))).toEqual([-2, 0, null, -0.5]);
  expect(teacherTerms([{ tokens: [1, 2], generated: true, logprobs: [-1, -1] }])).toEqual([null, null]);
});

test('position baselines: leave-one-out means per (sample, generated position), hand-worked', () => {
  const group = [
    [sample([-4, 0, -2]), sample([-1])], // rollout 0: two samples
    [sample([-2, -6])],
    [sample([-3, null, -1, -5])],
  ];
  expect(positionBaselines(group)).toEqual([
    [
      [(-2 - 3) / 2, -6, -1], // position 1: rollout 2's token there has no teacher term
      [0], // no other rollout has a second sample
    ],
    [[(-4 - 3) / 2, 0]],
    [[(-4 - 2) / 2, (0 - 6) / 2, -2, 0]], // position 3: no other rollout reaches it
  ]);
});

test("a rollout's baseline does not depend on its own tokens (the gradient's expectation is kept)", () => {
  const others = [[sample([-1, -2, -3])], [sample([-5, 0])]];
  const a = positionBaselines([[sample([-9, -9, -9])], ...others]);
  const b = positionBaselines([[sample([0, 7], [1])], ...others]);
  expect(a[0]).toEqual([[-3, -1, -3]]);
  expect(b[0]).toEqual(a[0]);
});

test('teacher_kl is the mean of student minus teacher logprob over the scored tokens', () => {
  expect(teacherKl([sample([-2, null]), sample([0, -1])])).toEqual({ teacher_kl: 1, tokens: 3 });
  expect(teacherKl([])).toEqual({ teacher_kl: 0, tokens: 0 });
});
