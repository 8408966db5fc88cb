#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace prime {

Sampled sampleToken(const float* logprobs, const float* probs, int64_t vocab, const SamplingParams& p,
                    std::mt19937_64& rng, std::vector<int32_t>& order) {
  // A NaN anywhere means the logits were not finite (NaN or +-Inf logits make log_softmax NaN):
  // there is no distribution to sample from. Every filter below would drop every token, so say so
  // instead (the caller fails the sequence).
  if (std::isnan(logprobs[0])) return {-1, std::numeric_limits<float>::quiet_NaN()};
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; i++) {
    if (std::isnan(logprobs[i])) return {-1, std::numeric_limits<float>::quiet_NaN()};
    if (logprobs[i] > logprobs[best]) best = i;  // first maximum wins ties
  }
  if (p.temperature <= 0) return {best, logprobs[best]};

  const bool filtered = p.minP > 0 || (p.topK > 0 && p.topK < vocab) || p.topP < 1.0;
  const double draw = double(rng() >> 11) * (1.0 / 9007199254740992.0);  // 53-bit uniform in [0, 1)
  if (!filtered) {
    // Inverse CDF over the whole vocabulary in token order.
    double total = 0;
    for (int64_t i = 0; i < vocab; i++) total += probs[i];
    const double u = draw * total;
    double acc = 0;
    for (int64_t i = 0; i < vocab; i++) {
      acc += probs[i];
      if (u < acc) return {i, logprobs[i]};
    }
    return {best, logprobs[best]};  // u within rounding of total
  }

  // Candidates in a deterministic order: by probability descending, then token id.
  auto before = [&](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); };
  order.clear();
  const double minProb = p.minP * probs[best];  // min-p: p_i >= minP * p_max
  for (int64_t i = 0; i < vocab; i++)
    if (probs[i] >= minProb) order.push_back(int32_t(i));
  if (p.topK > 0 && size_t(p.topK) < order.size()) {
    std::nth_element(order.begin(), order.begin() + p.topK, order.end(), before);
    order.resize(p.topK);
  }
  if (p.topP < 1.0) {
    std::sort(order.begin(), order.end(), before);
    double kept = 0;
    for (int32_t t : order) kept += probs[t];
    // Keep the smallest prefix whose mass reaches topP (of the mass surviving earlier filters).
    double acc = 0;
    size_t n = 0;
    while (n < order.size()) {
      acc += probs[order[n++]];
      if (acc >= p.topP * kept) break;
    }
    order.resize(n);
  }
  if (order.empty()) return {best, logprobs[best]};  // cannot happen for finite rows (best passes min-p)
  double total = 0;
  for (int32_t t : order) total += probs[t];
  const double u = draw * total;
  double acc = 0;
  for (int32_t t : order) {
    acc += probs[t];
    if (u < acc) return {t, logprobs[t]};
  }
  return {order.front(), logprobs[order.front()]};  // u within rounding of total
}

}  // namespace prime
