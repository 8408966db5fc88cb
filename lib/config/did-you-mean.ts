/** "Did you mean" suggestions for a mistyped key or name (the errors themselves: `ConfigError`, lib/failures.ts). */

/** Levenshtein distance, for "did you mean" suggestions. */
export function editDistance(a: string, b: string): number {
  const prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    let diag = prev[0];
    prev[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const up = prev[j];
      prev[j] = Math.min(prev[j] + 1, prev[j - 1] + 1, diag + (a[i - 1] === b[j - 1] ? 0 : 1));
      diag = up;
    }
  }
  return prev[b.length];
}

/**
 * The candidate closest to `wanted`, if it is close enough to be a plausible typo. Dotted paths are
 * compared whole, and also by their last segment so `--lrr` finds `trainer.optim.lr`.
 */
export function nearest(wanted: string, candidates: string[]): string | undefined {
  let best: string | undefined;
  let bestScore = Infinity;
  const wantedLast = wanted.split('.').pop()!;
  for (const c of candidates) {
    const whole = editDistance(wanted, c);
    const last = editDistance(wantedLast, c.split('.').pop()!) + (c.split('.').length === 1 ? 0 : 1);
    const score = Math.min(whole, last);
    if (score < bestScore || (score === bestScore && best !== undefined && c.length < best.length)) {
      best = c;
      bestScore = score;
    }
  }
  const limit = Math.max(2, Math.floor(wanted.length / 3));
  return bestScore <= limit ? best : undefined;
}

export function didYouMean(wanted: string, candidates: string[]): string {
  const s = nearest(wanted, candidates);
  return s ? ` Did you mean '${s}'?` : '';
}
