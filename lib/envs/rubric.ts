/** Rubric scoring: the reward is the weighted sum of named functions, each also logged by name. */
import type { JsonObject, Rubric, Score, ScoreContext } from './types';

/** Throws on an empty rubric or a repeated name, so metrics can never silently overwrite each other. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- rubrics of any state type
export function checkRubric(rubric: Rubric<any>, where: string): void {
  if (rubric.length === 0) throw new Error(`${where}: the rubric needs at least one reward function`);
  const seen = new Set<string>();
  for (const f of rubric) {
    if (seen.has(f.name)) throw new Error(`${where}: reward function "${f.name}" appears twice in the rubric`);
    seen.add(f.name);
    const w = f.weight ?? 1;
    if (!Number.isFinite(w)) throw new Error(`${where}: reward function "${f.name}" has weight ${w}`);
  }
}

export async function scoreRubric<S extends JsonObject>(rubric: Rubric<S>, ctx: ScoreContext<S>): Promise<Score> {
  const metrics: Record<string, number> = {};
  let reward = 0;
  for (const f of rubric) {
    const value = await f.fn(ctx);
    // NaN would poison the group's advantages (and JSON turns it into null): an env bug, so fail.
    if (typeof value !== 'number' || !Number.isFinite(value)) {
      throw new Error(`reward function "${f.name}" returned ${String(value)}, not a finite number`);
    }
    metrics[f.name] = value;
    reward += (f.weight ?? 1) * value;
  }
  return { reward, metrics };
}
