/** Packing of rollouts into trainer rows: sample building, first-fit-decreasing, invariants, batch files. */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { readBatch, writeBatch } from '../../lib/runfolder/batch';
import { Rng, uniformInt } from '../../lib/envs/random';
import { buildSample } from '../../lib/orchestrator/sample';
import { packSamples, type PackResult, type Sample, type TokenSegment } from '../../lib/runfolder/packing';
import { buildStepBatch, type StepBatchInput, type StepBatchResult } from '../../lib/orchestrator/step-batch';

/** A sample of `n` tokens with ids base, base+1, ...; odd positions generated. */
function sample(n: number, base = 0, advantage = 1): Sample {
  const ids = Array.from({ length: n }, (_, i) => base + i);
  return buildSample(
    ids.map((t, i) =>
      i % 2 === 1 ? { tokens: [t], generated: true, logprobs: [-(t % 7) / 8] } : { tokens: [t], generated: false },
    ),
    advantage,
  );
}

describe('buildSample', () => {
  test('multi-turn segments: one sequence, mask and logprobs only on generated tokens, advantage broadcast', () => {
    const s = buildSample(
      [
        { tokens: [1, 2, 3], generated: false }, // prompt
        { tokens: [4, 5], generated: true, logprobs: [-0.5, -0.25] }, // turn 1
        { tokens: [6], generated: false }, // env / tool response
        { tokens: [7], generated: true, logprobs: [-2] }, // turn 2
      ],
      0.75,
    );
    expect(Array.from(s.inputIds)).toEqual([1, 2, 3, 4, 5, 6, 7]);
    expect(Array.from(s.lossMask)).toEqual([0, 0, 0, 1, 1, 0, 1]);
    expect(Array.from(s.logprobs)).toEqual([0, 0, 0, -0.5, -0.25, 0, -2]);
    expect(Array.from(s.advantages)).toEqual([0, 0, 0, 0.75, 0.75, 0, 0.75]);
  });

  test('distillation: per-token advantage = teacher logprob - inference logprob + weight x advantage', () => {
    const segments: TokenSegment[] = [
      { tokens: [1, 2], generated: false },
      { tokens: [4, 5], generated: true, logprobs: [-0.5, -0.25], teacherLogprobs: [-1.5, -0.25] },
      { tokens: [6], generated: false },
      // The last token of a full-context sample has no teacher logprob: no distillation term.
      { tokens: [7], generated: true, logprobs: [-2], teacherLogprobs: [null] },
    ];
    expect(Array.from(buildSample(segments, 0.5, { weight: 0 }).advantages)).toEqual([0, 0, -1, 0, 0, 0]);
    expect(Array.from(buildSample(segments, 0.5, { weight: 2 }).advantages)).toEqual([0, 0, 0, 1, 0, 1]);
    // Without distillation the teacher's logprobs are ignored.
    expect(Array.from(buildSample(segments, 0.5).advantages)).toEqual([0, 0, 0.5, 0.5, 0, 0.5]);
    // A baseline has one entry per generated token, counted across segments; none for a token without a teacher term.
    expect(Array.from(buildSample(segments, 0.5, { weight: 0, baseline: [-0.5, 0.25, 9] }).advantages)).toEqual([
      0, 0, -0.5, -0.25, 0, 0,
    ]);
  });

  test('generated tokens need their logprobs', () => {
    expect(() => buildSample([{ tokens: [1, 2], generated: true, logprobs: [0] }], 1)).toThrow(
      /segment 0: generated tokens need one logprob each \(2 tokens, 1 logprobs\)/,
    );
  });
});

describe('packSamples', () => {
  test('first-fit-decreasing on a hand-worked case', () => {
    // lengths 3 7 5 4 2 6 -> placed 7, 6, 5, 4, 3, 2 into rows of 10
    const samples = [3, 7, 5, 4, 2, 6].map((n, i) => sample(n, 100 * i));
    const { rows, counts } = packSamples(samples, 10);
    expect(rows.map((r) => Array.from(r.sampleIndices))).toEqual([
      [1, 0],
      [5, 3],
      [2, 4],
    ]);
    expect(rows.map((r) => Array.from(r.sampleLengths))).toEqual([
      [7, 3],
      [6, 4],
      [5, 2],
    ]);
    expect(Array.from(rows[2].inputIds)).toEqual([200, 201, 202, 203, 204, 400, 401, 0, 0, 0]);
    expect(Array.from(rows[2].positionIds)).toEqual([0, 1, 2, 3, 4, 0, 1, 0, 0, 0]);
    expect(Array.from(rows[2].lossMask)).toEqual([0, 1, 0, 1, 0, 0, 1, 0, 0, 0]);
    expect(counts).toEqual({
      samples: 6,
      rows: 3,
      tokens: 27,
      lossTokens: 1 + 3 + 2 + 2 + 1 + 3,
      truncated: 0,
      truncatedTokens: 0,
      padding: 3,
    });
  });

  test('longer-than-row samples are truncated to seq_len and counted, never dropped', () => {
    const { rows, counts } = packSamples([sample(6, 10), sample(2, 50)], 4, { padTokenId: -1 });
    expect(rows.map((r) => Array.from(r.inputIds))).toEqual([
      [10, 11, 12, 13],
      [50, 51, -1, -1],
    ]);
    expect(counts).toMatchObject({
      samples: 2,
      rows: 2,
      tokens: 6,
      lossTokens: 3,
      truncated: 1,
      truncatedTokens: 2,
      padding: 2,
    });
  });

  test('bad input is rejected', () => {
    expect(() => packSamples([sample(0)], 4)).toThrow('packing: sample 0 has no tokens');
    const s = sample(3);
    expect(() => packSamples([{ ...s, logprobs: new Float32Array(2) }], 4)).toThrow(/arrays differ in length/);
    expect(() => packSamples([s], 0)).toThrow(/seq_len/);
  });

  test('randomized invariants (fixed seed): nothing lost or duplicated, boundaries, masks, first fit', () => {
    const rng = new Rng(1234, 'packing-test');
    for (let trial = 0; trial < 20; trial++) {
      const seqLen = uniformInt(rng, 8, 300);
      const samples: Sample[] = Array.from({ length: uniformInt(rng, 1, 150) }, (_, i) => {
        const prompt = uniformInt(rng, 1, seqLen);
        const completion = uniformInt(rng, 0, Math.ceil(seqLen / 2));
        const ids = (n: number) => Array.from({ length: n }, () => uniformInt(rng, 0, 150_000));
        return buildSample(
          [
            { tokens: ids(prompt), generated: false },
            {
              tokens: ids(completion),
              generated: true,
              logprobs: Array.from({ length: completion }, () => -uniformInt(rng, 0, 1000) / 100),
            },
          ],
          (i % 5) - 2,
        );
      });
      checkInvariants(samples, seqLen, packSamples(samples, seqLen));
    }
  });
});

/** Collects violations as strings (per-token `expect` calls would make the test take minutes). */
function checkInvariants(samples: Sample[], seqLen: number, { rows, counts }: PackResult) {
  const bad: string[] = [];
  const kept = samples.map((s) => Math.min(s.inputIds.length, seqLen));
  const seen = new Array(samples.length).fill(0);
  const finalFree = rows.map((r) => seqLen - r.sampleLengths.reduce((a, b) => a + b, 0));
  const same = (a: ArrayLike<number>, b: ArrayLike<number>, n: number) =>
    Array.from({ length: n }, (_, p) => a[p] === b[p]).every(Boolean);
  let tokens = 0;
  let lossTokens = 0;
  rows.forEach((row, r) => {
    for (const arr of [row.inputIds, row.positionIds, row.lossMask, row.logprobs, row.advantages])
      if (arr.length !== seqLen) bad.push(`row ${r}: length`);
    let at = 0;
    row.sampleIndices.forEach((i, k) => {
      seen[i]++;
      const n = row.sampleLengths[k];
      if (n !== kept[i]) bad.push(`sample ${i}: ${n} tokens placed, ${kept[i]} expected`);
      // First fit: the sample did not fit into any earlier row (whose free space only shrank).
      for (let q = 0; q < r; q++) if (n <= finalFree[q]) bad.push(`sample ${i} in row ${r} would fit row ${q}`);
      // Decreasing: within a row samples arrive longest first.
      if (k > 0 && n > row.sampleLengths[k - 1]) bad.push(`row ${r}: not decreasing`);
      const s = samples[i];
      if (!same(row.inputIds.subarray(at), s.inputIds, n)) bad.push(`sample ${i}: ids`);
      if (!same(row.lossMask.subarray(at), s.lossMask, n)) bad.push(`sample ${i}: mask`);
      if (!same(row.logprobs.subarray(at), s.logprobs, n)) bad.push(`sample ${i}: logprobs`);
      if (!same(row.advantages.subarray(at), s.advantages, n)) bad.push(`sample ${i}: advantages`);
      for (let p = 0; p < n; p++) {
        if (row.positionIds[at + p] !== p) bad.push(`sample ${i}: position ${p}`);
        // Mask right: logprobs and advantages only where the loss is.
        if (row.lossMask[at + p] === 0 && (row.logprobs[at + p] !== 0 || row.advantages[at + p] !== 0))
          bad.push(`sample ${i}: unmasked values at ${p}`);
        lossTokens += row.lossMask[at + p];
      }
      at += n;
    });
    tokens += at;
    if (at > seqLen) bad.push(`row ${r}: overfull`);
    for (let p = at; p < seqLen; p++) {
      if (row.lossMask[p] !== 0 || row.advantages[p] !== 0 || row.inputIds[p] !== 0)
        bad.push(`row ${r}: padding at ${p}`);
    }
  });
  seen.forEach((c, i) => c !== 1 && bad.push(`sample ${i} placed ${c} times`));
  expect(bad).toEqual([]);
  expect(counts).toEqual({
    samples: samples.length,
    rows: rows.length,
    tokens,
    lossTokens,
    truncated: samples.filter((s) => s.inputIds.length > seqLen).length,
    truncatedTokens: samples.reduce((n, s) => n + Math.max(0, s.inputIds.length - seqLen), 0),
    padding: rows.length * seqLen - tokens,
  });
  expect(tokens).toBe(kept.reduce((a, b) => a + b, 0));
}

describe('batch files', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'batch-'));
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

  test('read back as the packed rows without their padding, with step and counts', () => {
    const { rows, counts } = packSamples(
      [3, 7, 5, 4, 2, 6].map((n, i) => sample(n, 100 * i, i - 2.5)),
      10,
    );
    const file = path.join(dir, 'step_3.safetensors');
    writeBatch(file, 3, 10, rows, counts);
    const batch = readBatch(file);
    expect(batch).toMatchObject({ step: 3, seqLen: 10, counts });
    expect(batch.rows).toHaveLength(rows.length);
    batch.rows.forEach((got, r) => {
      const used = rows[r].sampleLengths.reduce((a, b) => a + b, 0);
      expect(Array.from(got.sampleLengths)).toEqual(Array.from(rows[r].sampleLengths));
      for (const key of ['inputIds', 'positionIds', 'lossMask', 'logprobs', 'advantages'] as const) {
        expect(Array.from(got[key])).toEqual(Array.from(rows[r][key].subarray(0, used)));
      }
    });
    expect(batch.rows[2].inputIds).toHaveLength(7); // 5 + 2 sample tokens, 3 of padding left on disk
  });

  test('a row whose sample lengths exceed seq_len is reported with the file', () => {
    const { rows, counts } = packSamples([sample(4)], 4);
    const file = path.join(dir, 'bad.safetensors');
    writeBatch(file, 0, 4, [{ ...rows[0], sampleLengths: Int32Array.from([3, 2]) }], counts);
    expect(() => readBatch(file)).toThrow(`${file} is damaged: row 0 holds 5 sample tokens, more than seq_len 4`);
  });
});

describe('a step batch of rollouts that are several samples', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'step-batch-'));
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
  /** Step 0's batch (grpo advantages, rows of 16) of rollouts.jsonl `lines`, written as `<name>.safetensors`. */
  const stepBatch = (
    name: string,
    lines: object[],
    options: Pick<StepBatchInput, 'filterZeroAdvantages' | 'distill'>,
  ): { r: StepBatchResult; batchFile: string } => {
    const rolloutsFile = path.join(dir, `${name}.jsonl`);
    fs.writeFileSync(rolloutsFile, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
    const batchFile = path.join(dir, `${name}.safetensors`);
    const r = buildStepBatch({
      step: 0,
      rolloutsFile,
      batchFile,
      seqLen: 16,
      advantage: { type: 'grpo', std_norm: false, kwargs: {} },
      ...options,
    });
    return { r, batchFile };
  };
  /** The advantages of the loss tokens of each sample in a batch file, by the sample's last token id. */
  const trainedAdvantages = (batchFile: string): Record<number, number[]> => {
    const bySample: Record<number, number[]> = {};
    for (const row of readBatch(batchFile).rows) {
      let at = 0;
      for (const len of row.sampleLengths) {
        const ids = Array.from(row.inputIds.subarray(at, at + len));
        bySample[ids[ids.length - 1]] = Array.from(row.advantages.subarray(at, at + len)).filter(
          (_, i) => row.lossMask[at + i] === 1,
        );
        at += len;
      }
    }
    return bySample;
  };
  const turn = (prompt: number[], sampled: number[]): TokenSegment[] => [
    { tokens: prompt, generated: false },
    { tokens: sampled, generated: true, logprobs: sampled.map(() => -1) },
  ];

  test('the group counts rollouts; every sample of a rollout carries its advantage', () => {
    // One group: rollout 0 split into two samples (its template broke the prefix), rollout 1 one
    // sample; rollout 2 was stored before rollouts held samples (one `segments` list).
    const lines = [
      { group: 0, reward: 1, completionTokens: 4, turns: 2, samples: [turn([1, 2], [3, 4]), turn([1, 2, 5], [6, 7])] },
      { group: 0, reward: 0, completionTokens: 2, turns: 1, samples: [turn([1, 2], [8, 9])] },
      { group: 0, reward: 0.5, completionTokens: 1, turns: 1, segments: turn([1, 2], [10]) },
    ];
    const { r, batchFile } = stepBatch('several-samples', lines, { filterZeroAdvantages: false });
    // Advantages over the 3 rollouts (mean 0.5), not over the 4 samples.
    expect(r.advantages).toMatchObject({ groups: 1, groups_kept: 1, rollouts: 3, rollouts_kept: 3 });
    expect(r.counts).toMatchObject({ samples: 4, tokens: 4 + 5 + 4 + 3, lossTokens: 7 });
    expect(trainedAdvantages(batchFile)).toEqual({ 4: [0.5, 0.5], 7: [0.5, 0.5], 9: [-0.5, -0.5], 10: [0] });
  });

  test("distilling: the position baseline of each token is the mean of the group's other rollouts there; teacher_kl", () => {
    const scored = (sampled: number[], terms: number[]): TokenSegment[] => [
      { tokens: [1, 2], generated: false },
      { tokens: sampled, generated: true, logprobs: sampled.map(() => -1), teacherLogprobs: terms.map((t) => t - 1) },
    ];
    // Teacher terms (teacher - student logprob): rollout 0 [-4, 0, -2], rollout 1 [-2, -6], rollout 2
    // errored (not trained, not in its group's baselines); group 1's two rollouts have equal rewards
    // (environment advantage 0: kept when distilling).
    const lines = [
      { group: 0, reward: 1, completionTokens: 3, turns: 1, samples: [scored([3, 4, 5], [-4, 0, -2])] },
      { group: 0, reward: 0, completionTokens: 2, turns: 1, samples: [scored([6, 7], [-2, -6])] },
      { group: 0, reward: 0, completionTokens: 1, turns: 1, samples: [scored([8], [-100])], error: 'env failed' },
      { group: 1, reward: 0.5, completionTokens: 1, turns: 1, samples: [scored([9], [-3])] },
      { group: 1, reward: 0.5, completionTokens: 1, turns: 1, samples: [scored([10], [-1])] },
    ];
    const advantages = (baseline: 'none' | 'position') => {
      const { r, batchFile } = stepBatch(`distill-${baseline}`, lines, {
        filterZeroAdvantages: true,
        distill: { weight: 0, baseline },
      });
      return { bySample: trainedAdvantages(batchFile), distill: r.distill };
    };
    const none = advantages('none');
    // The teacher term as is; group 1's zero environment advantage does not drop it when distilling.
    expect(none.bySample).toEqual({ 5: [-4, 0, -2], 7: [-2, -6], 9: [-3], 10: [-1] });
    // Mean reverse KL over the trained tokens: (4 + 0 + 2 + 2 + 6 + 3 + 1) / 7.
    expect(none.distill?.tokens).toBe(7);
    expect(none.distill?.teacher_kl).toBeCloseTo(18 / 7, 12);
    // Rollout 0 minus rollout 1's terms at the same positions (none at its third: 0) and vice versa.
    expect(advantages('position').bySample).toEqual({ 5: [-2, 6, -2], 7: [2, -6], 9: [-2], 10: [2] });
  });
});
