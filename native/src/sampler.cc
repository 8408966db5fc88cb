#include "sampler.h"

#include "sampler_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace prime {

namespace {
// 1 / T in S, at most S's largest value: a temperature so close to 0 that 1 / T overflows still
// gives (x - max) / T = 0 at the maximum (infinity times 0 would be NaN) and -inf below it.
template <typename S>
S inverseTemperature(double T) {
  return S(std::min(1.0 / T, double(std::numeric_limits<S>::max())));
}
}  // namespace

int64_t prepareRow(const float* x, int64_t vocab, double temperature, float* e, double* blockSums) {
  return cpu::kernels().sampleRowF32({x, e, blockSums, vocab, inverseTemperature<float>(temperature)});
}
int64_t prepareRow(const double* x, int64_t vocab, double temperature, double* e, double* blockSums) {
  return sampleRow(x, vocab, inverseTemperature<double>(temperature), e, blockSums);
}

namespace {
template <typename S>
float logprobOf(const RowLogits<S>& r, int64_t i, double logNorm) {
  return float((double(r.x[i]) - double(r.x[r.best])) / r.temperature - logNorm);
}
}  // namespace

template <typename S>
Sampled sampleToken(const RowLogits<S>& r, const SamplingParams& p, std::mt19937_64& rng, std::vector<int32_t>& order,
                    double* logNorm) {
  const int64_t vocab = r.vocab, best = r.best, blocks = sampleBlocks(vocab);
  double total = 0;
  for (int64_t b = 0; b < blocks; b++) total += r.blockSums[b];
  *logNorm = std::log(total);
  auto pick = [&](int64_t t) { return Sampled{t, logprobOf(r, t, *logNorm)}; };
  if (p.temperature <= 0) return pick(best);

  const bool filtered = filtersCandidates(p, vocab);
  const double draw = uniform53(rng);
  if (!filtered) {
    // Inverse CDF over the whole vocabulary in token order, a block at a time: into the block
    // whose sum reaches u, then token by token with each e computed there (on past the block's
    // end when rounding kept acc below u).
    const double u = draw * total, xBest = double(r.x[best]);
    double acc = 0;
    for (int64_t b = 0; b < blocks; b++) {
      if (u >= acc + r.blockSums[b]) {
        acc += r.blockSums[b];
        continue;
      }
      for (int64_t i = b * cpu::kSampleBlock; i < vocab; i++) {
        acc += std::exp((double(r.x[i]) - xBest) / r.temperature);
        if (u < acc) return pick(i);
      }
      break;
    }
    return pick(best);  // u within rounding of total
  }

  const S* probs = r.e;  // unnormalised: every filter below compares or sums ratios only
  // Candidates in a deterministic order: by probability descending, then token id.
  auto before = [&](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); };
  order.clear();
  const double minProb = p.minP * probs[best];  // min-p: p_i >= minP * p_max
  for (int64_t i = 0; i < vocab; i++)
    if (probs[i] >= minProb) order.push_back(int32_t(i));
  if (p.topK > 0 && size_t(p.topK) < order.size()) {
    std::nth_element(order.begin(), order.begin() + p.topK, order.end(), before);
    order.resize(p.topK);
    // Visited in the defined order, not nth_element's (k log k: k is small).
    if (p.topP >= 1.0) std::sort(order.begin(), order.end(), before);
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
  if (order.empty()) return pick(best);  // cannot happen for finite rows (best passes min-p)
  double mass = 0;
  for (int32_t t : order) mass += probs[t];
  const double u = draw * mass;
  double acc = 0;
  for (int32_t t : order) {
    acc += probs[t];
    if (u < acc) return pick(t);
  }
  return pick(order.front());  // u within rounding of mass
}

template <typename S>
void topLogprobs(const RowLogits<S>& r, double logNorm, int64_t k, std::vector<int32_t>& ids,
                 std::vector<float>& logprobs) {
  const S* x = r.x;
  k = std::min(k, r.vocab);
  ids.clear();
  // ids stays sorted by x descending; a later id enters only on a strictly larger value, so
  // equal values keep the lower id first.
  for (int64_t i = 0; i < r.vocab; i++) {
    if (int64_t(ids.size()) == k && !(x[i] > x[ids.back()])) continue;
    if (int64_t(ids.size()) == k) ids.pop_back();
    auto at = std::upper_bound(ids.begin(), ids.end(), x[i], [&](S v, int32_t id) { return v > x[id]; });
    ids.insert(at, int32_t(i));
  }
  logprobs.clear();
  for (int32_t id : ids) logprobs.push_back(logprobOf(r, id, logNorm));
}

std::string samplingError(const SamplingParams& p, int64_t vocab) {
  if (!std::isfinite(p.presencePenalty) || !std::isfinite(p.frequencyPenalty))
    return "presencePenalty and frequencyPenalty must be finite";
  if (p.minTokens < 0) return "minTokens must be >= 0";
  for (const auto& [token, bias] : p.logitBias) {
    if (token < 0 || token >= vocab)
      return "logitBias: token id " + std::to_string(token) + " is outside the vocabulary (size " +
             std::to_string(vocab) + ")";
    if (!std::isfinite(bias)) return "logitBias: the bias of token " + std::to_string(token) + " is not finite";
  }
  return "";
}

LogitAdjuster::LogitAdjuster(const SamplingParams& p, const std::vector<int64_t>& stopTokenIds, int64_t vocab) : p_(p) {
  if (p.minTokens > 0)
    for (int64_t t : stopTokenIds)
      if (t >= 0 && t < vocab) stops_.push_back(t);
  active_ = !p_.logitBias.empty() || penalizes() || !stops_.empty();
}

void LogitAdjuster::sampled(int64_t token) {
  generated_++;
  if (penalizes()) counts_[token]++;
}

void LogitAdjuster::fixedDeltas(std::vector<std::pair<int64_t, double>>& out) const {
  out.assign(p_.logitBias.begin(), p_.logitBias.end());
  for (const auto& [token, n] : counts_)
    out.emplace_back(token, -(p_.frequencyPenalty * double(n) + p_.presencePenalty));
}

template <typename S>
void LogitAdjuster::apply(S* row) const {
  for (const auto& [token, bias] : p_.logitBias) row[token] = S(double(row[token]) + bias);
  for (const auto& [token, n] : counts_)
    row[token] = S(double(row[token]) - p_.frequencyPenalty * double(n) - p_.presencePenalty);
  if (generated_ < p_.minTokens)
    for (int64_t token : stops_) row[token] = -std::numeric_limits<S>::infinity();
}

#define PRIME_SAMPLER(S)                                                                                               \
  template Sampled sampleToken<S>(const RowLogits<S>&, const SamplingParams&, std::mt19937_64&, std::vector<int32_t>&, \
                                  double*);                                                                            \
  template void topLogprobs<S>(const RowLogits<S>&, double, int64_t, std::vector<int32_t>&, std::vector<float>&);      \
  template void LogitAdjuster::apply<S>(S*) const;
PRIME_SAMPLER(float)
PRIME_SAMPLER(double)
#undef PRIME_SAMPLER

}  // namespace prime
