/**
 * A rollout's sample as trainer input: its token segments concatenated, the loss on the sampled
 * tokens, each carrying the rollout's advantage (and, distilling, the teacher's term). Packing the
 * samples into rows is lib/runfolder/packing.ts.
 */
import { routeWidth, type Sample, type TokenSegment } from '../runfolder/packing';
import { teacherTerms } from './distill';

/**
 * Concatenates a sample's segments in order (prompt, completion of turn 1, env response, ...):
 * within a sample each turn extends the previous turn's tokens, so this is the sequence the model saw.
 *
 * With `distill` (online distillation), a generated token's advantage is its teacher logprob minus
 * its inference logprob (reverse KL to the teacher), less `distill.baseline`'s entry for it (one per
 * generated token, in order; lib/orchestrator/distill.ts), plus `distill.weight` x the rollout's
 * advantage. A token without a teacher logprob gets no teacher term.
 */
export function buildSample(
  segments: readonly TokenSegment[],
  advantage: number,
  distill?: { weight: number; baseline?: ArrayLike<number> },
): Sample {
  const length = segments.reduce((n, s) => n + s.tokens.length, 0);
  const sample: Sample = {
    inputIds: new Int32Array(length),
    lossMask: new Uint8Array(length),
    logprobs: new Float32Array(length),
    advantages: new Float32Array(length),
  };
  const width = routeWidth(
    segments.map((s) => ({ routes: s.routes, tokens: s.tokens.length })),
    (k) => `segment ${k}`,
  );
  if (width !== undefined) sample.routes = new Int32Array(length * width).fill(-1);
  const terms = distill ? teacherTerms(segments) : undefined;
  let at = 0;
  let generated = 0; // generated tokens before this segment: the index into terms and distill.baseline
  for (const [k, seg] of segments.entries()) {
    const n = seg.tokens.length;
    for (let i = 0; i < n; i++) sample.inputIds[at + i] = seg.tokens[i];
    if (seg.routes) sample.routes!.set(seg.routes, at * width!);
    if (seg.generated) {
      if (!seg.logprobs || seg.logprobs.length !== n) {
        throw new Error(
          `segment ${k}: generated tokens need one logprob each (${n} tokens, ${seg.logprobs?.length ?? 0} logprobs)`,
        );
      }
      for (let i = 0; i < n; i++) sample.logprobs[at + i] = seg.logprobs[i];
      sample.lossMask.fill(1, at, at + n);
      if (distill) {
        for (let i = 0; i < n; i++) {
          const term = terms![generated + i];
          const teacher = term === null ? 0 : term - (distill.baseline?.[generated + i] ?? 0);
          sample.advantages[at + i] = teacher + distill.weight * advantage;
        }
      } else sample.advantages.fill(advantage, at, at + n);
      generated += n;
    }
    at += n;
  }
  return sample;
}
