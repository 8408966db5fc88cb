// Sampling a decode step's rows with tensor ops on the logits' own device (CUDA), the same
// distribution and, row by row, the same tokens as the host sampler (sampler.h) given the same
// uniform: only [n] tokens, logprobs and flags (and the top logprobs asked for) reach the host,
// never the [n, vocab] logits. Each row's uniform is drawn on the host from the sequence's own
// RNG, exactly one per non-greedy row as the host sampler draws, so a sequence's tokens depend
// only on its seed and its logits, whatever else is in the batch.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "sampler.h"

namespace prime {

struct TensorSampleRow {
  SamplingParams params;
  double draw = 0;          // the row's uniform in [0, 1) (unused when greedy)
  int64_t topLogprobs = 0;  // how many top logprobs to return (0..kMaxTopLogprobs)
  // The sequence's logit adjustments (sampler.h; null: none), applied on the device and told the
  // tokens sampled (readSampled).
  LogitAdjuster* adjust = nullptr;
};

struct TensorSampled {
  std::vector<Sampled> sampled;  // token -1 (logprob NaN): the row is not a distribution
  std::vector<std::vector<int32_t>> topIds;
  std::vector<std::vector<float>> topLogprobs;
};

// logits [n, vocab] (fp32 or fp64) on any device; rows[i] describes row i.
TensorSampled sampleWithTensorOps(const at::Tensor& logits, const std::vector<TensorSampleRow>& rows);

// The same in parts, for several decode steps per host round trip (the generator's multi-step
// decode): the rows' settings go to the device once, each step samples there with its own
// uniforms, and the steps' results are read together.
struct TensorSampling {
  at::Tensor params;  // [n, columns] fp64 on the logits' device
  int64_t topK = 0;   // top logprobs returned per row (the most any row asked for)
  bool anySorted = false;
  // The rows' logit adjustments, when any row has some, as they stand at the call's step `step`
  // (the tokens of its earlier steps counted on the device).
  struct Adjustments {
    at::Tensor rows, tokens, deltas;       // [E]: added to the logits (bias, penalties of the tokens so far)
    at::Tensor seen;                       // [n, H]: the tokens each row sampled so far (-1: none), for presence
    at::Tensor penalties;                  // [n, 2]: frequency and presence penalty
    at::Tensor stopRows, stops, stopsFor;  // [S]: a stop token of a row, banned for that many steps
    bool penalize = false;
    int64_t step = 0;
  };
  std::optional<Adjustments> adjust;
};
TensorSampling prepareTensorSampling(const std::vector<TensorSampleRow>& rows, int64_t vocab, const at::Device& device);
// One step's rows sampled on the device with uniforms draws [n] (fp64, same device): [n, 3 + 2
// topK] fp64 (token, logprob, non-finite flag, top ids, top logprobs), nothing read back. The
// adjustments of `setup` count the step's tokens for the next.
at::Tensor sampleOnDevice(const at::Tensor& logits, TensorSampling& setup, const at::Tensor& draws);
// sampleOnDevice's result, copied to the host, as the rows' tokens (each told to its row's adjuster).
TensorSampled readSampled(const at::Tensor& hostResult, const std::vector<TensorSampleRow>& rows, int64_t topK);

}  // namespace prime
