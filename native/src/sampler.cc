#include "sampler.h"

#include <algorithm>
#include <cmath>

namespace prime {

Sampled sampleToken(const float* logits, int64_t vocab, const SamplingParams& p, std::mt19937_64& rng,
                    std::vector<float>& e, std::vector<int32_t>& order) {
  const bool greedy = p.temperature <= 0;
  const double invT = greedy ? 1.0 : 1.0 / p.temperature;
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; i++)
    if (logits[i] > logits[best]) best = i;  // first maximum wins ties
  // e_i = exp((l_i - l_max) / T): unnormalised probabilities, max 1.
  e.resize(vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; i++) {
    e[i] = float(std::exp((double(logits[i]) - logits[best]) * invT));
    sum += e[i];
  }
  const double logZ = std::log(sum);
  auto logprobOf = [&](int64_t t) { return float((double(logits[t]) - logits[best]) * invT - logZ); };
  if (greedy) return {best, logprobOf(best)};

  // Candidates in a deterministic order: by probability descending, then token id.
  auto before = [&](int32_t a, int32_t b) { return e[a] > e[b] || (e[a] == e[b] && a < b); };
  order.clear();
  for (int64_t i = 0; i < vocab; i++)
    if (p.minP <= 0 || e[i] >= p.minP) order.push_back(int32_t(i));  // p_i >= minP * p_max
  if (p.topK > 0 && size_t(p.topK) < order.size()) {
    std::nth_element(order.begin(), order.begin() + p.topK, order.end(), before);
    order.resize(p.topK);
  }
  if (p.topP < 1.0) {
    std::sort(order.begin(), order.end(), before);
    double kept = 0;
    for (int32_t t : order) kept += e[t];
    // Keep the smallest prefix whose mass reaches topP (of the mass surviving earlier filters).
    double acc = 0;
    size_t n = 0;
    while (n < order.size()) {
      acc += e[order[n++]];
      if (acc >= p.topP * kept) break;
    }
    order.resize(n);
  }
  double total = 0;
  for (int32_t t : order) total += e[t];
  const double u = double(rng() >> 11) * (1.0 / 9007199254740992.0) * total;  // 53-bit uniform in [0, total)
  double acc = 0;
  for (int32_t t : order) {
    acc += e[t];
    if (u < acc) return {t, logprobOf(t)};
  }
  return {order.back(), logprobOf(order.back())};  // u within rounding of total
}

}  // namespace prime
