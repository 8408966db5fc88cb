/** The launcher's progress line: an ETA that says what it knows. */
import { formatDuration, stepLine } from '../../lib/run-ops/progress';

const started = 1_000_000;

test('the ETA is the pace so far times the steps left', () => {
  // 10 steps in 100 s since the line started at step 0: 90 steps left at 10 s each.
  expect(stepLine(10, 100, { started, first: 0 }, ['loss 1.00e+0'], { now: started + 100_000 })).toBe(
    'step 10/100 | loss 1.00e+0 | ETA 15m00s | ',
  );
  expect(stepLine(10, 100, { started, first: 0 }, [], { now: started + 100_000, paused: true })).toBe(
    'step 10/100 | ETA 15m00s | PAUSED',
  );
  expect(stepLine(0, 100, { started }, [], { now: started + 5_000 })).toBe('step 0/100 | ETA ? | ');
});

test('with a target loss that may end the run early, the ETA is an upper bound and says so', () => {
  const line = stepLine(10, 100, { started, first: 0 }, [], {
    now: started + 100_000,
    mayEndEarly: 'sooner if val loss reaches 0.05',
  });
  expect(line).toBe('step 10/100 | ETA ≤15m00s (sooner if val loss reaches 0.05) | ');
});

test('durations read as seconds, minutes or hours, rounded to the second', () => {
  expect(formatDuration(42.4)).toBe('42s');
  expect(formatDuration(59.6)).toBe('1m00s');
  expect(formatDuration(245)).toBe('4m05s');
  expect(formatDuration(2 * 3600 + 3 * 60 + 59)).toBe('2h03m');
  expect(formatDuration(NaN)).toBe('?');
});
