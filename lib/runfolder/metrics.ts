/**
 * `metrics.jsonl`: one JSON line per finished step, appended in step order (a run records step n
 * only once step n-1's line is written). Appending costs one line, whatever the file's length.
 *
 * A retried activity or a replayed workflow never writes a step twice: a step at or below the last
 * line's is looked up before anything is written. Every append is one `write` of a whole line
 * ending in a newline, so a crash can at worst leave a torn last line without its newline: readers
 * ignore it, and the next append cuts it off first (its step was not acknowledged, so it is
 * recorded again).
 */
import * as fs from 'node:fs';
import { asDiskFull, writeFileAtomic } from '../atomic';

export interface StepRecord {
  step: number;
  [key: string]: unknown;
}

/**
 * The Python prime-rl's documented metric names, each read from our record of a step: the one
 * table of these names (metrics.jsonl lines and W&B carry both spellings).
 */
export const DOCUMENTED_METRICS: Readonly<Record<string, (r: StepRecord) => unknown>> = {
  'train/reward': (r) => r.reward_mean,
  'train/loss': (r) => r.loss,
  'train/learning_rate': (r) => r.lr,
  // The KL to the reference (initial) policy that [kl_penalty] steers; absent while it is off.
  'train/kl_divergence': (r) => (typeof r.kl_beta === 'number' && r.kl_beta > 0 ? r.kl_divergence : undefined),
  // Completion tokens per rollout (all turns).
  'rollout/mean_length': (r) =>
    typeof r.completion_tokens === 'number' && typeof r.rollouts === 'number' && r.rollouts > 0
      ? r.completion_tokens / r.rollouts
      : undefined,
  'rollout/generation_time': (r) => r.generate_seconds,
};

/** `record` with the documented names added (those whose value is a number). */
export function withDocumentedNames(record: StepRecord): StepRecord {
  const out: StepRecord = { ...record };
  for (const [name, read] of Object.entries(DOCUMENTED_METRICS)) {
    const v = read(record);
    if (typeof v === 'number' && Number.isFinite(v)) out[name] = v;
  }
  return out;
}

/** The complete lines of `text` (a torn last line, without its newline, is not one). */
function completeLines(text: string): string[] {
  const end = text.lastIndexOf('\n');
  return end < 0 ? [] : text.slice(0, end).split('\n');
}

export function readStepMetrics(file: string): StepRecord[] {
  if (!fs.existsSync(file)) return [];
  return completeLines(fs.readFileSync(file, 'utf8'))
    .map((l, i) => ({ l, i }))
    .filter(({ l }) => l.trim() !== '')
    .map(({ l, i }) => {
      try {
        return JSON.parse(l) as StepRecord;
      } catch {
        throw new Error(`${file}: line ${i + 1} is not JSON`);
      }
    });
}

/**
 * Where the complete lines of the open file end (bytes), and the step of the last one, reading
 * only the end of the file: a window of the last bytes, doubled until it holds the last line whole.
 */
function lastLine(fd: number, size: number): { end: number; step?: number } {
  for (let window = 64 * 1024; ; window *= 2) {
    const start = Math.max(0, size - window);
    const buf = Buffer.alloc(size - start);
    fs.readSync(fd, buf, 0, buf.length, start);
    const nl = buf.lastIndexOf(0x0a);
    if (nl < 0) {
      if (start > 0) continue;
      return { end: 0 };
    }
    const prev = buf.lastIndexOf(0x0a, nl - 1);
    if (prev < 0 && start > 0) continue;
    const end = start + nl + 1;
    const line = buf.subarray(prev + 1, nl).toString('utf8');
    try {
      const step = (JSON.parse(line) as StepRecord).step;
      return Number.isFinite(step) ? { end, step } : { end };
    } catch {
      return { end };
    }
  }
}

/** Appends `record` unless a line for its step exists; returns whether it wrote. */
export function appendStepMetrics(file: string, record: StepRecord): boolean {
  const fd = fs.openSync(file, 'a+');
  try {
    const size = fs.fstatSync(fd).size;
    const { end, step: last } = lastLine(fd, size);
    // A torn last line: an append that a crash cut short, never acknowledged. Cut it off.
    if (end < size) fs.ftruncateSync(fd, end);
    // At or below the last step (a retry, a replay, a second start of the run): look the step up.
    // Without a readable last step, too (a file this module did not write).
    if ((last === undefined && end > 0) || (last !== undefined && record.step <= last)) {
      if (readStepMetrics(file).some((r) => r.step === record.step)) return false;
    }
    // One write of the whole line. A short one (a disk that fills up mid-line) is cut off again and
    // fails, so the line is written whole by a retry, never counted as written when torn.
    const line = Buffer.from(`${JSON.stringify(record)}\n`);
    try {
      const written = fs.writeSync(fd, line);
      if (written < line.length)
        throw Object.assign(new Error(`wrote ${written} of ${line.length} bytes`), { code: 'ENOSPC' });
      fs.fsyncSync(fd);
    } catch (e) {
      try {
        fs.ftruncateSync(fd, end);
      } catch {
        // the torn line is cut off by the next append
      }
      throw asDiskFull(e, file);
    }
    return true;
  } finally {
    fs.closeSync(fd);
  }
}

/** Drops the lines of steps at or after `step` (a run rewound to `step`: ckpt.resume_step), atomically. */
export function truncateStepMetrics(file: string, step: number): void {
  if (!fs.existsSync(file)) return;
  const lines = completeLines(fs.readFileSync(file, 'utf8')).filter((l) => l.trim() !== '');
  const kept = lines.filter((l) => (JSON.parse(l) as StepRecord).step < step);
  if (kept.length !== lines.length) writeFileAtomic(file, kept.map((l) => `${l}\n`).join(''));
}
