/**
 * Online distillation's per-token term (`[distill]` types opd and opsd, docs/algorithms.md, "Distillation").
 * Each generated token with a teacher logprob gets `teacher logprob - student logprob`: minus the
 * single-sample estimate of the per-token reverse KL, whose policy gradient is the reverse-KL
 * gradient. Packing adds it to the token's advantage (lib/orchestrator/sample.ts `buildSample`).
 *
 * That estimate is unbiased but noisy: a confident teacher gives a student's wrong token -10 to -20
 * and an agreeing one about 0, so on a batch the mean is far from zero and a few tokens carry
 * nearly all of the gradient. A baseline (`distill.baseline`) subtracted from the term keeps the
 * gradient's expectation and can cut its variance:
 *   none:     the term as is (prime-rl's teacher_tau term, the Thinking Machines recipe).
 *   position: at the k-th generated token of a sample, the mean term of the k-th generated tokens of
 *             the same sample of the other rollouts of its group (same prompt, sampled
 *             independently, so the baseline does not depend on this token: leave-one-out, as
 *             RLOO). Positions no other rollout reaches get 0.
 */
import type { TokenSegment } from '../runfolder/packing';

/** The teacher term of each generated token of a sample, in order; null where the teacher gave none. */
export function teacherTerms(segments: readonly TokenSegment[]): (number | null)[] {
  const terms: (number | null)[] = [];
  for (const s of segments) {
    if (!s.generated) continue;
    for (let i = 0; i < s.tokens.length; i++) {
      const teacher = s.teacherLogprobs?.[i];
      terms.push(teacher === undefined || teacher === null || !s.logprobs ? null : teacher - s.logprobs[i]);
    }
  }
  return terms;
}

/**
 * The `position` baselines of a group's valid rollouts (each a list of samples): for rollout i,
 * sample s, generated token k, the mean of the other rollouts' terms at (s, k).
 */
export function positionBaselines(group: readonly (readonly TokenSegment[][])[]): number[][][] {
  const terms = group.map((samples) => samples.map(teacherTerms));
  return terms.map((samples, i) =>
    samples.map((own, s) =>
      own.map((_, k) => {
        let sum = 0;
        let n = 0;
        terms.forEach((other, j) => {
          const t = j === i ? null : (other[s]?.[k] ?? null);
          if (t !== null) {
            sum += t;
            n++;
          }
        });
        return n === 0 ? 0 : sum / n;
      }),
    ),
  );
}

/** `teacher_kl` of a step: the mean of student minus teacher logprob over the tokens the teacher scored. */
export function teacherKl(samples: readonly (readonly TokenSegment[])[]): { teacher_kl: number; tokens: number } {
  let sum = 0;
  let tokens = 0;
  for (const segments of samples)
    for (const t of teacherTerms(segments)) {
      if (t === null) continue;
      sum -= t;
      tokens++;
    }
  return { teacher_kl: tokens === 0 ? 0 : sum / tokens, tokens };
}
