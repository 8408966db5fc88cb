// Per-sequence token sampling on one row of logits (plain C++, no torch).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace prime {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  double topP = 1.0;         // nucleus mass kept, (0, 1]
  int64_t topK = -1;         // -1 (or 0) = off
  double minP = 0.0;         // drop tokens with p < minP * p_max
};

struct Sampled {
  int64_t token;  // -1: the row is not a distribution (NaN from non-finite logits)
  // log softmax(logits / T)[token] over the full vocabulary, before top-k/top-p/min-p filtering
  // (vLLM's sampled-token logprob with temperature applied, which is what the trainer recomputes).
  // Greedy (T = 0) reports log softmax(logits)[token].
  float logprob;
};

// Samples one token from one row of logprobs = log_softmax(logits / T) (T = 1 when greedy) and
// probs = exp(logprobs), both computed vectorised for the whole batch by the caller. Filters in
// vLLM's order: min-p, top-k, top-p. Exactly one uniform is drawn from rng per non-greedy call, so
// a sequence's tokens depend only on its own seed and logits, never on the rest of the batch.
// `order` is reusable workspace. A row holding NaN (non-finite logits) samples nothing: token -1.
Sampled sampleToken(const float* logprobs, const float* probs, int64_t vocab, const SamplingParams& p,
                    std::mt19937_64& rng, std::vector<int32_t>& order);

}  // namespace prime
