/**
 * Eval results as a table: one row per environment x model version (environments in first-seen
 * order, model versions in the given order), shared by the terminal renderer and the HTML report.
 */
import type { EvalResults } from './results';

export interface EvalTable {
  header: string[];
  rows: string[][];
  /** Per column: numbers are right-aligned. */
  numeric: boolean[];
}

const reward = (x: number) => x.toFixed(3);

export function evalTable(results: readonly EvalResults[]): EvalTable {
  const envs = [...new Set(results.flatMap((r) => Object.keys(r.environments)))];
  const ks = [
    ...new Set(results.flatMap((r) => Object.values(r.environments).flatMap((m) => Object.keys(m.pass_at_k ?? {})))),
  ]
    .map(Number)
    .sort((a, b) => a - b);
  const header = ['environment', 'model', 'k', 'avg@k', 'std', ...ks.map((k) => `pass@${k}`), 'tokens'];
  const rows: string[][] = [];
  for (const env of envs) {
    for (const r of results) {
      const m = r.environments[env];
      if (!m) continue;
      const pass = ks.map((k) => {
        const v = m.pass_at_k?.[String(k)];
        return v === undefined ? '-' : reward(v);
      });
      rows.push([
        env,
        r.model,
        String(m.rollouts_per_example),
        reward(m.avg_at_k),
        reward(m.reward_std),
        ...pass,
        m.completion_tokens_mean.toFixed(1),
      ]);
    }
  }
  return { header, rows, numeric: header.map((_, i) => i >= 2) };
}

/** Plain-text table with aligned columns, for the terminal. */
export function renderEvalTable(results: readonly EvalResults[]): string {
  const { header, rows, numeric } = evalTable(results);
  if (rows.length === 0) return '(no eval results)';
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (numeric[i] ? c.padStart(widths[i]) : c.padEnd(widths[i])))
      .join('  ')
      .trimEnd();
  return [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
}
