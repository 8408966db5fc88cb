/** Packed rows of tokens and their per-token scores: what scoring, training and the checks share. */

export type TokenIds = Int32Array | number[];

/**
 * One packed row: samples back to back, position ids restarting at 0 for each sample. A new
 * sample starts wherever a position id does not continue the previous one; attention is causal
 * and never crosses a sample boundary.
 */
export interface PackedRow {
  inputIds: TokenIds;
  positionIds: TokenIds;
}

/**
 * Per-token scores aligned with the row's tokens: `logprobs[t]` = log p(token t | the tokens
 * before it in its sample) under softmax(logits / temperature); `entropies[t]` = entropy of that
 * distribution. Both are 0 at the first token of each sample (nothing predicts it).
 */
export interface RowScores {
  logprobs: Float32Array;
  entropies: Float32Array;
}

export type Reals = Float32Array | Float64Array | number[];
