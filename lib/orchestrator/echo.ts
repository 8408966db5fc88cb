/**
 * ECHO (`orchestrator.echo`, docs/algorithms.md): besides the policy loss on the tokens the model
 * sampled, the environment's observation tokens (tool results, user feedback) are trained by
 * cross-entropy, each at its message role's weight. A sample's tokens are its segments in order;
 * the observation tokens are those of the segments the model did not sample that come after its
 * first sampled one (the prompt before the first answer is the task, not an observation), and
 * `TokenSegment.roles` says which message each span of them belongs to. A span weighs its role's
 * weight; every token of the span counts, the chat template's role header and separators included
 * (the renderer's content attribution that prime-rl narrows them with is not on our samples).
 */
import type { EchoRole } from '../config/names';
import type { TokenSegment } from '../runfolder/packing';

export type EchoRoles = Partial<Record<EchoRole, number>>;

/**
 * The cross-entropy weight of each token of a sample (its segments concatenated): a role's weight
 * on its observation spans, 0 elsewhere (the sampled tokens, the prompt, roles not chosen, and
 * spans whose role is unknown).
 */
export function echoWeights(segments: readonly TokenSegment[], roles: EchoRoles): Float32Array {
  const length = segments.reduce((n, s) => n + s.tokens.length, 0);
  const weights = new Float32Array(length);
  let at = 0;
  let answered = false;
  for (const seg of segments) {
    const n = seg.tokens.length;
    if (seg.generated) answered = true;
    else if (answered && seg.roles) {
      let covered = 0;
      for (const span of seg.roles) {
        const w = roles[span.role as EchoRole] ?? 0;
        const end = Math.min(n, covered + span.tokens);
        if (w > 0) weights.fill(w, at + covered, at + end);
        covered = end;
      }
    }
    at += n;
  }
  return weights;
}
