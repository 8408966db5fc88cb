/** Learning-rate schedules, evaluated in TS and passed to the native trainer step by step. */

export interface LrSchedule {
  kind: 'constant' | 'linear' | 'cosine';
  /** Peak learning rate. */
  lr: number;
  /** Steps of linear warmup from 0 to lr. Default 0. */
  warmupSteps?: number;
  /** Total steps (needed by linear/cosine decay). */
  totalSteps?: number;
  /** Floor the decay ends at. Default 0. */
  minLr?: number;
}

/** Learning rate for optimizer step `step` (0-based). */
export function lrAt(s: LrSchedule, step: number): number {
  const warmup = s.warmupSteps ?? 0;
  if (step < warmup) return (s.lr * (step + 1)) / warmup;
  if (s.kind === 'constant') return s.lr;
  const total = s.totalSteps;
  if (total === undefined || total <= warmup) throw new Error(`${s.kind} schedule needs totalSteps > warmupSteps`);
  const minLr = s.minLr ?? 0;
  const progress = Math.min(1, (step - warmup) / (total - warmup));
  const decay = s.kind === 'linear' ? 1 - progress : 0.5 * (1 + Math.cos(Math.PI * progress));
  return minLr + (s.lr - minLr) * decay;
}
