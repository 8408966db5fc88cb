/**
 * Trainer input: one token sequence per sample (a rollout's turns concatenated, lib/orchestrator/sample.ts;
 * a rollout whose chat template breaks the prefix is several samples, lib/orchestrator/token-rollout.ts;
 * an SFT example, lib/sft/tokenize.ts), packed first-fit-decreasing
 * into fixed rows of `seq_len` tokens. Attention must not cross samples, so every row records its
 * samples' lengths; position ids restart at 0 with each sample, as each sample was generated from
 * position 0.
 */

/** A contiguous run of a rollout's tokens: prompt / env / tool tokens, or tokens the model sampled. */
export interface TokenSegment {
  tokens: ArrayLike<number>;
  /** True for tokens the model generated: they carry the loss. */
  generated: boolean;
  /** Inference logprob of each sampled token (mu); required when `generated`. */
  logprobs?: ArrayLike<number>;
  /** Policy version that sampled each token (generated segments); a record, packing ignores it. */
  versions?: ArrayLike<number>;
  /** Online distillation: the teacher's logprob of each generated token (null: none, no distillation term). */
  teacherLogprobs?: ArrayLike<number | null>;
  /**
   * MoE router replay: the experts inference routed each token to, [tokens, sparse layers x
   * experts per token] flattened (-1 where inference never fed the token). Absent = unknown.
   */
  routes?: ArrayLike<number>;
  /**
   * Tokens the model did not sample: the messages they render, in order, as spans of `tokens`
   * tokens each (the chat template's scaffold around a message counted with it). Echo trains
   * observation tokens by role (lib/orchestrator/echo.ts). Absent = unknown.
   */
  roles?: readonly { role: string; tokens: number }[];
}

/** One sample ready to pack; all arrays have the same length. */
export interface Sample {
  inputIds: Int32Array;
  /** 1 on generated tokens, 0 on prompt and env/tool tokens. */
  lossMask: Uint8Array;
  /** Inference logprobs where the mask is 1, 0 elsewhere. */
  logprobs: Float32Array;
  /** The rollout's advantage where the mask is 1, 0 elsewhere. */
  advantages: Float32Array;
  /**
   * Cross-entropy weight of each token (echo's observation tokens, a teacher's tokens in sft
   * distillation), trained beside the policy loss; absent = none. A token may carry both.
   */
  ceWeights?: Float32Array;
  /** Router replay: [length, width] flattened, -1 where unknown (see `TokenSegment.routes`). */
  routes?: Int32Array;
}

/**
 * The common per-token width of `routes` arrays of `holders` of `tokens` tokens each (undefined
 * when none has routes); `what` names a holder in the error when two disagree.
 */
export function routeWidth(
  holders: readonly { routes?: ArrayLike<number>; tokens: number }[],
  what: (i: number) => string,
): number | undefined {
  let width: number | undefined;
  holders.forEach(({ routes, tokens }, i) => {
    if (!routes) return;
    const w = routes.length / tokens;
    if (!Number.isInteger(w) || w < 1 || (width !== undefined && w !== width))
      throw new Error(
        `${what(i)}: routes has ${routes.length} entries for ${tokens} tokens, expected tokens x ${width ?? 'a width'}`,
      );
    width = w;
  });
  return width;
}

export interface PackedRow {
  /** Every array has `seq_len` entries; entries after the samples are padding. */
  inputIds: Int32Array;
  positionIds: Int32Array;
  lossMask: Uint8Array;
  logprobs: Float32Array;
  advantages: Float32Array;
  /** Cross-entropy weights (`Sample.ceWeights`); present when a sample of the batch had them. */
  ceWeights?: Float32Array;
  /** Lengths of the samples in this row, in row order (attention blocks). */
  sampleLengths: Int32Array;
  /** Index in the input of each of those samples. */
  sampleIndices: Int32Array;
  /** Router replay: [seq_len, width] flattened, -1 where unknown; present when a sample had routes. */
  routes?: Int32Array;
}

export interface PackCounts {
  samples: number;
  rows: number;
  /** Sample tokens placed in rows (after truncation). */
  tokens: number;
  /** Tokens with loss mask 1. */
  lossTokens: number;
  /** Tokens with a cross-entropy weight above 0 (absent in batches written before they existed). */
  ceTokens?: number;
  /** Samples longer than seq_len, cut to their first seq_len tokens. */
  truncated: number;
  /** Tokens cut off by truncation. */
  truncatedTokens: number;
  /** Padding tokens: rows * seq_len - tokens. */
  padding: number;
}

export interface PackResult {
  rows: PackedRow[];
  counts: PackCounts;
}

export interface PackOptions {
  /** Token id written into padding (default 0); padding never carries loss. */
  padTokenId?: number;
}

function checkSample(s: Sample, i: number): void {
  const n = s.inputIds.length;
  if (n === 0) throw new Error(`packing: sample ${i} has no tokens`);
  if (
    s.lossMask.length !== n ||
    s.logprobs.length !== n ||
    s.advantages.length !== n ||
    (s.ceWeights !== undefined && s.ceWeights.length !== n)
  ) {
    throw new Error(`packing: sample ${i} arrays differ in length`);
  }
}

/**
 * First-fit-decreasing: samples sorted by length (longest first; ties keep input order) each go
 * into the first row with room, else a new row. Longer-than-row samples are truncated and counted.
 */
export function packSamples(samples: readonly Sample[], seqLen: number, opts: PackOptions = {}): PackResult {
  if (!Number.isInteger(seqLen) || seqLen < 1)
    throw new Error(`packing: seq_len must be a positive integer, got ${seqLen}`);
  samples.forEach(checkSample);
  const width = routeWidth(
    samples.map((s) => ({ routes: s.routes, tokens: s.inputIds.length })),
    (i) => `packing: sample ${i}`,
  );
  const lengths = samples.map((s) => Math.min(s.inputIds.length, seqLen));
  const weighted = samples.some((s) => s.ceWeights !== undefined);
  const order = samples.map((_, i) => i).sort((a, b) => lengths[b] - lengths[a] || a - b);

  const bins: { free: number; members: number[] }[] = [];
  for (const i of order) {
    let bin = bins.find((b) => b.free >= lengths[i]);
    if (!bin) {
      bin = { free: seqLen, members: [] };
      bins.push(bin);
    }
    bin.members.push(i);
    bin.free -= lengths[i];
  }

  const counts: PackCounts = {
    samples: samples.length,
    rows: bins.length,
    tokens: 0,
    lossTokens: 0,
    truncated: 0,
    truncatedTokens: 0,
    padding: 0,
    ...(weighted ? { ceTokens: 0 } : {}),
  };
  const rows = bins.map(({ members }) => {
    const row: PackedRow = {
      inputIds: new Int32Array(seqLen).fill(opts.padTokenId ?? 0),
      positionIds: new Int32Array(seqLen),
      lossMask: new Uint8Array(seqLen),
      logprobs: new Float32Array(seqLen),
      advantages: new Float32Array(seqLen),
      ...(weighted ? { ceWeights: new Float32Array(seqLen) } : {}),
      sampleLengths: Int32Array.from(members, (i) => lengths[i]),
      sampleIndices: Int32Array.from(members),
      ...(width !== undefined ? { routes: new Int32Array(seqLen * width).fill(-1) } : {}),
    };
    let at = 0;
    for (const i of members) {
      const s = samples[i];
      const n = lengths[i];
      if (n < s.inputIds.length) {
        counts.truncated++;
        counts.truncatedTokens += s.inputIds.length - n;
      }
      row.inputIds.set(s.inputIds.subarray(0, n), at);
      row.lossMask.set(s.lossMask.subarray(0, n), at);
      row.logprobs.set(s.logprobs.subarray(0, n), at);
      row.advantages.set(s.advantages.subarray(0, n), at);
      if (s.ceWeights) {
        row.ceWeights!.set(s.ceWeights.subarray(0, n), at);
        for (let p = 0; p < n; p++) if (s.ceWeights[p] > 0) counts.ceTokens!++;
      }
      if (s.routes) row.routes!.set(s.routes.subarray(0, n * width!), at * width!);
      for (let p = 0; p < n; p++) row.positionIds[at + p] = p;
      for (let p = 0; p < n; p++) counts.lossTokens += s.lossMask[p];
      at += n;
    }
    counts.tokens += at;
    return row;
  });
  counts.padding = rows.length * seqLen - counts.tokens;
  return { rows, counts };
}
