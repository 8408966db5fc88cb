import { nextKlBeta } from '../../lib/trainer/kl-controller';

describe('adaptive KL beta (Ziegler et al., one update per step)', () => {
  const p = { enabled: true, beta: 0.1, targetKl: 0.02 };
  test('proportional to KL / target - 1 inside the clip', () => {
    expect(nextKlBeta(p, 0.1, 0.022)).toBeCloseTo(0.1 * 1.1, 15);
    expect(nextKlBeta(p, 0.1, 0.019)).toBeCloseTo(0.1 * 0.95, 15);
    expect(nextKlBeta(p, 0.1, 0.02)).toBe(0.1);
  });
  test('at most 20% a step either way', () => {
    expect(nextKlBeta(p, 0.1, 1)).toBeCloseTo(0.12, 15);
    expect(nextKlBeta(p, 0.1, 0)).toBeCloseTo(0.08, 15);
  });
  test('fixed without target_kl, off when disabled, unchanged by a non-finite KL', () => {
    expect(nextKlBeta({ enabled: true, beta: 0.1 }, 0.1, 5)).toBe(0.1);
    expect(nextKlBeta({ ...p, enabled: false }, 0.1, 5)).toBe(0.1);
    expect(nextKlBeta(p, 0.1, NaN)).toBe(0.1);
  });
});
