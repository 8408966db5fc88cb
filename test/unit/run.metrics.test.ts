/** metrics.jsonl: appended one line per step, never twice for a step, never rewritten whole; a torn last line is repaired. */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { appendStepMetrics, readStepMetrics, truncateStepMetrics } from '../../lib/runfolder/metrics';

let dir: string;
beforeEach(() => (dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-metrics-'))));
afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

test('each step gets one line, in order, whatever the retries', () => {
  const file = path.join(dir, 'metrics.jsonl');
  expect(appendStepMetrics(file, { step: 0, loss: 1 })).toBe(true);
  expect(appendStepMetrics(file, { step: 1, loss: 0.5 })).toBe(true);
  // A retried record of the last step, and a second start of the run re-walking its first step.
  expect(appendStepMetrics(file, { step: 1, loss: 0.4 })).toBe(false);
  expect(appendStepMetrics(file, { step: 0, loss: 0.9 })).toBe(false);
  expect(appendStepMetrics(file, { step: 2, loss: 0.25 })).toBe(true);
  expect(readStepMetrics(file)).toEqual([
    { step: 0, loss: 1 },
    { step: 1, loss: 0.5 },
    { step: 2, loss: 0.25 },
  ]);
});

test('a line is appended to the file, which is never rewritten whole', () => {
  const file = path.join(dir, 'metrics.jsonl');
  appendStepMetrics(file, { step: 0 });
  const { ino } = fs.statSync(file);
  const before = fs.readFileSync(file, 'utf8');
  for (let s = 1; s < 50; s++) appendStepMetrics(file, { step: s, pad: 'x'.repeat(100) });
  // Same file (a rewrite through a temp file would be a new one), its first bytes untouched.
  expect(fs.statSync(file).ino).toBe(ino);
  expect(fs.readFileSync(file, 'utf8').startsWith(before)).toBe(true);
  expect(readStepMetrics(file).map((r) => r.step)).toEqual(Array.from({ length: 50 }, (_, s) => s));
});

test('a torn last line (a crash during an append) is ignored by readers and replaced by the next append', () => {
  const file = path.join(dir, 'metrics.jsonl');
  appendStepMetrics(file, { step: 0, loss: 1 });
  appendStepMetrics(file, { step: 1, loss: 0.5 });
  // Step 2's append was cut short; the activity was not acknowledged, so its retry records it again.
  fs.appendFileSync(file, '{"step": 2, "lo');
  expect(readStepMetrics(file).map((r) => r.step)).toEqual([0, 1]);
  expect(appendStepMetrics(file, { step: 2, loss: 0.25 })).toBe(true);
  expect(fs.readFileSync(file, 'utf8')).toBe('{"step":0,"loss":1}\n{"step":1,"loss":0.5}\n{"step":2,"loss":0.25}\n');
  // Torn mid-line after a complete JSON object (the newline lost): still re-recorded once.
  fs.appendFileSync(file, '{"step":3,"loss":0.1}');
  expect(appendStepMetrics(file, { step: 3, loss: 0.1 })).toBe(true);
  expect(readStepMetrics(file).map((r) => r.step)).toEqual([0, 1, 2, 3]);
});

test('a line longer than the tail window is still found', () => {
  const file = path.join(dir, 'metrics.jsonl');
  appendStepMetrics(file, { step: 0, big: 'y'.repeat(200_000) });
  expect(appendStepMetrics(file, { step: 0 })).toBe(false);
  expect(appendStepMetrics(file, { step: 1 })).toBe(true);
  expect(readStepMetrics(file).map((r) => r.step)).toEqual([0, 1]);
});

test('truncateStepMetrics drops the steps from a rewind point on', () => {
  const file = path.join(dir, 'metrics.jsonl');
  for (let s = 0; s < 5; s++) appendStepMetrics(file, { step: s });
  truncateStepMetrics(file, 3);
  expect(readStepMetrics(file).map((r) => r.step)).toEqual([0, 1, 2]);
  expect(appendStepMetrics(file, { step: 3 })).toBe(true);
  expect(readStepMetrics(file).map((r) => r.step)).toEqual([0, 1, 2, 3]);
});
