// Per-sequence token sampling on one row of logits (plain C++, no torch).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cpu_kernels.h"

namespace prime {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  double topP = 1.0;         // nucleus mass kept, (0, 1]
  int64_t topK = -1;         // -1 (or 0) = off
  double minP = 0.0;         // drop tokens with p < minP * p_max
  // OpenAI's and vLLM's penalties, on the tokens the sequence sampled so far (its prompt's not
  // counted): each logit minus frequencyPenalty x the token's count, and presencePenalty once it
  // occurred.
  double presencePenalty = 0.0, frequencyPenalty = 0.0;
  std::vector<std::pair<int64_t, double>> logitBias;  // (token, added to its logit)
  int64_t minTokens = 0;  // the stop tokens are not sampled before this many tokens (vLLM's min_tokens)
};

// What is wrong with `p` for a vocabulary of `vocab` tokens ("" when nothing).
std::string samplingError(const SamplingParams& p, int64_t vocab);

// What a sequence's settings and the tokens it sampled so far change in its next row of logits,
// before anything else reads it (vLLM's order, all before temperature, so greedy sampling sees them
// too): the logit bias added, its stop tokens banned (-inf) while fewer than minTokens were sampled,
// and its presence and frequency penalties subtracted. Both samplers apply these (the host sampler
// to the row in place, tensor_sampler.h on the device), so the reported logprobs and top logprobs
// are of the distribution sampled from. It goes with its sequence (a preempted one keeps it), told
// each token as it is sampled: the same tokens whatever happens around them.
class LogitAdjuster {
 public:
  LogitAdjuster() = default;
  // Stop tokens outside the vocabulary of `vocab` are never sampled anyway: none to ban.
  LogitAdjuster(const SamplingParams& p, const std::vector<int64_t>& stopTokenIds, int64_t vocab);

  // Whether it changes any row at all (else the samplers skip it).
  bool active() const { return active_; }
  bool penalizes() const { return p_.presencePenalty != 0 || p_.frequencyPenalty != 0; }
  // A token was sampled (the next row's penalties and min_tokens count it).
  void sampled(int64_t token);

  // Adds the changes to a row of `vocab` logits, in place.
  template <typename S>
  void apply(S* row) const;

  // The parts as the tensor sampler takes them: the bias and the penalties of the tokens so far
  // ((token, delta), a token possibly twice), the tokens sampled so far, the stop tokens and how
  // many more tokens they stay banned for.
  void fixedDeltas(std::vector<std::pair<int64_t, double>>& out) const;
  const std::unordered_map<int64_t, int64_t>& counts() const { return counts_; }
  const std::vector<int64_t>& bannedStops() const { return stops_; }
  int64_t stopsBannedFor() const { return std::max<int64_t>(0, p_.minTokens - generated_); }
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  std::vector<int64_t> stops_;
  bool active_ = false;
  int64_t generated_ = 0;
  std::unordered_map<int64_t, int64_t> counts_;  // sampled token -> times (kept when a penalty is on)
};

struct Sampled {
  int64_t token;  // -1: the row is not a distribution (NaN from non-finite logits)
  // log softmax(logits / T)[token] over the full vocabulary, before top-k/top-p/min-p filtering
  // (vLLM's sampled-token logprob with temperature applied, which is what the trainer recomputes).
  // Greedy (T = 0) reports log softmax(logits)[token].
  float logprob;
};

// One row of a decode step's distribution, as the generator hands it over (prepareRow): raw
// logits `x`, their first maximum `best`, the sums of e[i] = exp((x[i] - x[best]) / T) (T = 1 when
// greedy) by blocks of cpu::kSampleBlock tokens, and e itself only for a row whose sampling
// filters its candidates (null otherwise: the inverse-CDF scan steps over whole blocks and
// computes e only inside the block it stops in). Nothing of size vocab is normalised:
// log softmax(x / T)[i] = (x[i] - x[best]) / T - log(sum e), with sum e taken once by sampleToken
// from the block sums.
template <typename S>
struct RowLogits {
  const S* x;
  const S* e;
  const double* blockSums;
  int64_t vocab, best;
  double temperature;  // 1 when greedy
};

// Blocks of a row of `vocab` tokens (the length of prepareRow's blockSums).
inline int64_t sampleBlocks(int64_t vocab) { return (vocab + cpu::kSampleBlock - 1) / cpu::kSampleBlock; }

// Fills blockSums (and e, when not null) of a row of logits x [vocab] for temperature T (1 when
// greedy) and returns its first maximum, or -1 when the row is not a distribution (a NaN, or a
// non-finite maximum: log_softmax would be NaN). One vectorised pass over x, two with e
// (sampler_rows.h; fp32 rows by the copy compiled for this CPU), on the calling thread.
int64_t prepareRow(const float* x, int64_t vocab, double temperature, float* e, double* blockSums);
int64_t prepareRow(const double* x, int64_t vocab, double temperature, double* e, double* blockSums);

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
