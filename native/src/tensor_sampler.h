// Sampling a decode step's rows with tensor ops on the logits' own device (CUDA), the same
// distribution and, row by row, the same tokens as the host sampler (sampler.h) given the same
// uniform: only [n] tokens, logprobs and flags (and the top logprobs asked for) reach the host,
// never the [n, vocab] logits. Each row's uniform is drawn on the host from the sequence's own
// RNG, exactly one per non-greedy row as the host sampler draws, so a sequence's tokens depend
// only on its seed and its logits, whatever else is in the batch.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "sampler.h"

namespace prime {

struct TensorSampleRow {
  SamplingParams params;
  double draw = 0;          // the row's uniform in [0, 1) (unused when greedy)
  int64_t topLogprobs = 0;  // how many top logprobs to return (0..kMaxTopLogprobs)
};

struct TensorSampled {
  std::vector<Sampled> sampled;  // token -1 (logprob NaN): the row is not a distribution
  std::vector<std::vector<int32_t>> topIds;
  std::vector<std::vector<float>> topLogprobs;
};

// logits [n, vocab] (fp32 or fp64) on any device; rows[i] describes row i.
TensorSampled sampleWithTensorOps(const at::Tensor& logits, const std::vector<TensorSampleRow>& rows);

}  // namespace prime
