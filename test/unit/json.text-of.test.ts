// textOf: a value from outside as text for an error message, bounded whatever was sent.
import { textOf } from '../../lib/json';

test('a string as it is, anything else as JSON', () => {
  expect(textOf('run failed')).toBe('run failed');
  expect(textOf({ code: 3 })).toBe('{"code":3}');
  expect(textOf(undefined)).toBe('undefined');
});

test('a large, cyclic or deeply nested value still becomes bounded text', () => {
  const big = textOf({ error: 'x'.repeat(10_000) });
  expect(big.length).toBeLessThan(2100);
  expect(big).toMatch(/\.\.\. \(10012 characters\)$/);
  const cycle: Record<string, unknown> = {};
  cycle.self = cycle;
  expect(textOf(cycle)).toBe('[object Object]');
  expect(textOf(10n)).toBe('10');
  let deep: unknown = 0;
  for (let i = 0; i < 200_000; i++) deep = [deep];
  expect(typeof textOf(deep)).toBe('string');
});
