/**
 * `metrics.jsonl`: one JSON line per finished step. Appending is idempotent by step, so a retried
 * activity or a replayed workflow never writes a step twice, and atomic (the file is rewritten
 * through a temp file), so a crash never leaves half a line.
 */
import * as fs from 'node:fs';
import { writeFileAtomic } from '../atomic';

export interface StepRecord {
  step: number;
  [key: string]: unknown;
}

export function readStepMetrics(file: string): StepRecord[] {
  if (!fs.existsSync(file)) return [];
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l, i) => {
      try {
        return JSON.parse(l) as StepRecord;
      } catch {
        throw new Error(`${file}: line ${i + 1} is not JSON`);
      }
    });
}

/** Appends `record` unless a line for its step exists; returns whether it wrote. */
export function appendStepMetrics(file: string, record: StepRecord): boolean {
  const existing = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '';
  if (readStepMetrics(file).some((r) => r.step === record.step)) return false;
  const sep = existing === '' || existing.endsWith('\n') ? '' : '\n';
  writeFileAtomic(file, `${existing}${sep}${JSON.stringify(record)}\n`);
  return true;
}
