/** The weighted env mix: determinism in (seed, step), proportions, no repeats within an epoch. */
import { EnvMix, type MixDraw } from '../../lib/envs/mix';

const key = (d: MixDraw) => `${d.env}:${d.index}`;

describe('EnvMix', () => {
  test('a step is a pure function of (seed, step): fresh instances and any call order agree', () => {
    const entries = [{ weight: 1 }, { weight: 3, size: 10 }];
    const a = new EnvMix(entries, { seed: 1, examplesPerStep: 8 });
    const seq = [0, 1, 2, 3, 4, 5].map((s) => a.sample(s));
    const b = new EnvMix(entries, { seed: 1, examplesPerStep: 8 });
    expect(b.sample(5)).toEqual(seq[5]); // resume straight at step 5
    expect(b.sample(2)).toEqual(seq[2]);
    expect(new EnvMix(entries, { seed: 2, examplesPerStep: 8 }).sample(0)).not.toEqual(seq[0]);
  });

  test('each step gets floor or ceil of its weighted share per env', () => {
    const mix = new EnvMix([{ weight: 0.5 }, { weight: 0.3 }, { weight: 0.2 }], { seed: 0, examplesPerStep: 16 });
    const totals = [0, 0, 0];
    for (let step = 0; step < 200; step++) {
      const counts = [0, 0, 0];
      for (const d of mix.sample(step)) counts[d.env]++;
      expect(counts[0]).toBe(8);
      expect([4, 5]).toContain(counts[1]);
      expect([3, 4]).toContain(counts[2]);
      counts.forEach((c, k) => (totals[k] += c));
    }
    expect(totals[1] / 3200).toBeCloseTo(0.3, 2);
    expect(totals[2] / 3200).toBeCloseTo(0.2, 2);
  });

  test('weights near the largest number: shares as for equal weights (their sum used to overflow)', () => {
    for (const weights of [
      [1e308, 1e308],
      [Number.MAX_VALUE, Number.MAX_VALUE, Number.MAX_VALUE / 2],
    ]) {
      const mix = new EnvMix(
        weights.map((weight) => ({ weight })),
        { seed: 0, examplesPerStep: 10 },
      );
      const counts = weights.map(() => 0);
      for (const d of mix.sample(0)) counts[d.env]++;
      expect(counts).toEqual(weights.length === 2 ? [5, 5] : [4, 4, 2]);
    }
  });

  test('finite datasets: every example once per epoch, then a new order', () => {
    const size = 12;
    const mix = new EnvMix([{ weight: 1, size }, { weight: 1 }], { seed: 4, examplesPerStep: 6 });
    const draws = Array.from({ length: 40 }, (_, s) => mix.sample(s))
      .flat()
      .filter((d) => d.env === 0);
    expect(draws.length).toBe(120);
    const epochs: number[][] = [];
    for (const d of draws) (epochs[d.epoch] ??= []).push(d.index);
    expect(epochs).toHaveLength(10);
    for (const e of epochs) expect([...e].sort((x, y) => x - y)).toEqual(Array.from({ length: size }, (_, i) => i));
    expect(epochs[1]).not.toEqual(epochs[0]);
    // Epochs are visited in order.
    expect(draws.map((d) => d.epoch)).toEqual([...draws.map((d) => d.epoch)].sort((x, y) => x - y));
  });

  test('generated datasets never repeat an example', () => {
    const mix = new EnvMix([{ weight: 2 }, { weight: 1 }], { seed: 9, examplesPerStep: 5 });
    const all = Array.from({ length: 100 }, (_, s) => mix.sample(s)).flat();
    expect(new Set(all.map(key)).size).toBe(all.length);
    expect(all.every((d) => d.epoch === 0)).toBe(true);
  });

  test('bad entries are rejected', () => {
    expect(() => new EnvMix([], { seed: 0, examplesPerStep: 1 })).toThrow('env mix: no environments');
    expect(() => new EnvMix([{ weight: 0 }], { seed: 0, examplesPerStep: 1 })).toThrow(/weights must be positive/);
    expect(() => new EnvMix([{ weight: 1, size: 0 }], { seed: 0, examplesPerStep: 1 })).toThrow(/at least 1/);
    expect(() => new EnvMix([{ weight: 1 }], { seed: 0, examplesPerStep: 1 }).sample(-1)).toThrow(/non-negative/);
  });
});
