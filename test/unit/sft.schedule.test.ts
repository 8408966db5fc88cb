/** SFT step batches: seeded per-epoch shuffles, epochs vs max_steps, deterministic resumes. */
import { SftSchedule } from '../../lib/sft';

const all = (s: SftSchedule) => Array.from({ length: s.totalSteps }, (_, k) => s.batch(k));

describe('SftSchedule', () => {
  test('epochs: every sample exactly once per epoch, full batches until the last', () => {
    const s = new SftSchedule({ datasetSize: 10, batchSize: 4, epochs: 3, seed: 0 });
    expect(s.totalSteps).toBe(8); // 30 samples / 4
    const batches = all(s);
    expect(batches.map((b) => b.indices.length)).toEqual([4, 4, 4, 4, 4, 4, 4, 2]);
    const stream = batches.flatMap((b) => b.indices);
    for (let e = 0; e < 3; e++)
      expect([...stream.slice(e * 10, e * 10 + 10)].sort((a, b) => a - b)).toEqual([...Array(10).keys()]);
    // Step 2 holds stream positions 8..11: the end of epoch 0 and the start of epoch 1.
    expect(batches.map((b) => b.epoch)).toEqual([0, 0, 0, 1, 1, 2, 2, 2]);
    expect(stream.slice(0, 10)).not.toEqual(stream.slice(10, 20));
  });

  test('max_steps wins over epochs and keeps drawing new epochs', () => {
    const s = new SftSchedule({ datasetSize: 3, batchSize: 2, epochs: 1, maxSteps: 5, seed: 1 });
    expect(s.totalSteps).toBe(5);
    const batches = all(s);
    expect(batches.every((b) => b.indices.length === 2)).toBe(true);
    expect(batches[4].epoch).toBe(2);
    expect(() => s.batch(5)).toThrow('SFT schedule: step 5 is outside 0..4');
  });

  test('a batch larger than the dataset spans several epochs', () => {
    const s = new SftSchedule({ datasetSize: 2, batchSize: 5, epochs: 4, seed: 0 });
    expect(s.totalSteps).toBe(2);
    expect(all(s).map((b) => b.indices.length)).toEqual([5, 3]);
  });

  test('deterministic: a fresh schedule (a resumed run) sees the same batches; the seed changes them', () => {
    const opts = { datasetSize: 50, batchSize: 8, epochs: 2, seed: 7 };
    const first = all(new SftSchedule(opts));
    const resumed = new SftSchedule(opts);
    expect(resumed.batch(9)).toEqual(first[9]);
    expect(resumed.batch(3)).toEqual(first[3]);
    expect(all(new SftSchedule({ ...opts, seed: 8 }))[0].indices).not.toEqual(first[0].indices);
  });

  test('bad options are errors', () => {
    expect(() => new SftSchedule({ datasetSize: 0, batchSize: 1, epochs: 1, seed: 0 })).toThrow(
      'datasetSize must be a positive integer, got 0',
    );
    expect(() => new SftSchedule({ datasetSize: 1, batchSize: 1, epochs: 1, maxSteps: 1.5, seed: 0 })).toThrow(
      /maxSteps must be a positive integer/,
    );
  });
});
