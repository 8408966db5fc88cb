/** The one-line progress of a run the launcher shows while it waits (`step 12/100 | ... | ETA 4m10s`). */

/** A duration for people (the progress line's ETA, the report's wall time): `42s`, `4m05s`, `2h03m`; `?` when unknown. */
export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds)) return '?';
  const s = Math.round(seconds);
  const [h, m] = [Math.floor(s / 3600), Math.floor((s % 3600) / 60)];
  const two = (n: number) => String(n).padStart(2, '0');
  return h > 0 ? `${h}h${two(m)}m` : m > 0 ? `${m}m${two(s % 60)}s` : `${s}s`;
}

/** When the progress line's clock started, and the steps done then (first seen). */
export interface StepRate {
  started: number;
  first?: number;
}

export interface StepLineOptions {
  paused?: boolean;
  /**
   * The run may end before `total` (SFT's val.target_loss): the ETA, from the steps left to
   * `total`, is then only an upper bound, and says so.
   */
  mayEndEarly?: string;
  /** Now (ms); for tests. */
  now?: number;
}

/** Steps done / total, `parts`, and an ETA from the pace of the steps done since the line's clock started. */
export function stepLine(
  trained: number,
  total: number | undefined,
  rate: StepRate,
  parts: string[],
  opts: StepLineOptions = {},
): string {
  rate.first ??= trained;
  const done = trained - rate.first;
  const perStep = done > 0 ? ((opts.now ?? Date.now()) - rate.started) / 1000 / done : NaN;
  const left = total !== undefined ? (total - trained) * perStep : NaN;
  const eta =
    opts.mayEndEarly && Number.isFinite(left)
      ? `ETA ≤${formatDuration(left)} (${opts.mayEndEarly})`
      : `ETA ${formatDuration(left)}`;
  return [`step ${trained}/${total ?? '∞'}`, ...parts, eta, opts.paused ? 'PAUSED' : ''].join(' | ');
}
