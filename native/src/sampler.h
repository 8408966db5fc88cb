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

// One row of a decode step's distribution, as the generator hands it over: raw logits `x`, their
// first maximum `best` (rowArgmax) and e[i] = exp((x[i] - x[best]) / T) (T = 1 when greedy),
// computed vectorised for the whole batch. Nothing of size vocab is normalised: log softmax(x /
// T)[i] = (x[i] - x[best]) / T - log(sum e), with sum e taken once by sampleToken.
template <typename S>
struct RowLogits {
  const S* x;
  const S* e;
  int64_t vocab, best;
  double temperature;  // 1 when greedy
};

// Whether a non-greedy row's sampling filters its candidates (min-p, top-k below the vocabulary, top-p),
// and whether it visits them by probability (top-k or top-p) rather than in token order.
inline bool filtersCandidates(const SamplingParams& p, int64_t vocab) {
  return p.minP > 0 || (p.topK > 0 && p.topK < vocab) || p.topP < 1.0;
}
inline bool visitsByProbability(const SamplingParams& p, int64_t vocab) {
  return (p.topK > 0 && p.topK < vocab) || p.topP < 1.0;
}

// A 53-bit uniform in [0, 1) from a sequence's RNG: the one draw a non-greedy token takes.
inline double uniform53(std::mt19937_64& rng) { return double(rng() >> 11) * (1.0 / 9007199254740992.0); }

// The first maximum of a row of logits, or -1 when the row is not a distribution (a NaN, or a
// non-finite maximum: log_softmax would be NaN). One pass, comparisons only.
template <typename S>
int64_t rowArgmax(const S* x, int64_t vocab);

// Samples one token of a valid row (best >= 0). Filters in vLLM's order: min-p, top-k, top-p; the
// candidate list is built only with a filter on, and visited in token order under min-p alone,
// else by probability descending (ties: lower id; sorted are the top k, or with top-p the
// survivors of the other filters). tensor_sampler.h follows the same rules. Exactly one uniform is
// drawn from rng per non-greedy call, so a sequence's tokens depend only on its own seed and
// logits, never on the rest of the batch. `order` is reusable workspace. Sets *logNorm to
// log(sum e), for topLogprobs.
template <typename S>
Sampled sampleToken(const RowLogits<S>& row, const SamplingParams& p, std::mt19937_64& rng, std::vector<int32_t>& order,
                    double* logNorm);

// The k most likely tokens of a valid row, descending (ties: lower id first), and their log
// softmax(x / T): one pass keeping a sorted list of k (k is small, at most kMaxTopLogprobs).
template <typename S>
void topLogprobs(const RowLogits<S>& row, double logNorm, int64_t k, std::vector<int32_t>& ids,
                 std::vector<float>& logprobs);

}  // namespace prime
