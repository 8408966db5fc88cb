#include "tensor_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace prime {

namespace {
// First index of each row of `cdf` [n, L] (non-decreasing) whose value exceeds target[i] (the
// host sampler's `u < acc`), or L when none does.
at::Tensor firstAbove(const at::Tensor& cdf, const at::Tensor& target) {
  return at::searchsorted(cdf, target.unsqueeze(1).contiguous(), /*out_int32=*/false, /*right=*/true).squeeze(1);
}

// The columns of TensorSampling::params.
enum Col { kT, kMinP, kTopP, kTopK, kGreedy, kSorted, kCols };

// The rows' adjusters as device tensors, in one host-to-device copy (fp64: token ids are exact).
TensorSampling::Adjustments prepareAdjustments(const std::vector<TensorSampleRow>& rows, const at::Device& dev) {
  const int64_t n = int64_t(rows.size());
  std::vector<double> fixed, stops;  // (row, token, delta) and (row, token, steps banned)
  std::vector<std::vector<int64_t>> seen(static_cast<size_t>(n));
  std::vector<double> penalties(size_t(n) * 2, 0.0);
  std::vector<std::pair<int64_t, double>> deltas;
  TensorSampling::Adjustments a;
  size_t widest = 1;
  for (int64_t i = 0; i < n; i++) {
    const LogitAdjuster* adj = rows[i].adjust;
    if (!adj || !adj->active()) continue;
    adj->fixedDeltas(deltas);
    for (const auto& [token, delta] : deltas) fixed.insert(fixed.end(), {double(i), double(token), delta});
    for (int64_t token : adj->bannedStops())
      stops.insert(stops.end(), {double(i), double(token), double(adj->stopsBannedFor())});
    if (adj->penalizes()) {
      a.penalize = true;
      penalties[size_t(i) * 2] = adj->params().frequencyPenalty;
      penalties[size_t(i) * 2 + 1] = adj->params().presencePenalty;
      for (const auto& [token, count] : adj->counts()) seen[size_t(i)].push_back(token);
      widest = std::max(widest, seen[size_t(i)].size());
    }
  }
  const int64_t E = int64_t(fixed.size() / 3), S = int64_t(stops.size() / 3), H = int64_t(widest);
  std::vector<double> packed = std::move(fixed);
  packed.insert(packed.end(), stops.begin(), stops.end());
  packed.insert(packed.end(), penalties.begin(), penalties.end());
  for (const auto& tokens : seen) {
    packed.insert(packed.end(), tokens.begin(), tokens.end());
    packed.insert(packed.end(), size_t(H) - tokens.size(), -1.0);
  }
  const at::Tensor all = at::tensor(packed, at::TensorOptions().dtype(at::kDouble)).to(dev);
  int64_t offset = 0;
  auto take = [&](int64_t rowsOf, int64_t cols) {
    at::Tensor t = all.narrow(0, offset, rowsOf * cols).view({rowsOf, cols});
    offset += rowsOf * cols;
    return t;
  };
  const at::Tensor f = take(E, 3), st = take(S, 3);
  a.rows = f.select(1, 0).to(at::kLong);
  a.tokens = f.select(1, 1).to(at::kLong);
  a.deltas = f.select(1, 2).contiguous();
  a.stopRows = st.select(1, 0).to(at::kLong);
  a.stops = st.select(1, 1).to(at::kLong);
  a.stopsFor = st.select(1, 2).contiguous();
  a.penalties = take(n, 2);
  a.seen = take(n, H).to(at::kLong);
  return a;
}

// The logits with the adjustments of the current step added (a copy).
at::Tensor adjusted(const at::Tensor& x, const TensorSampling::Adjustments& a) {
  at::Tensor y = x.clone();
  const auto dtype = y.scalar_type();
  y.index_put_({a.rows, a.tokens}, a.deltas.to(dtype), /*accumulate=*/true);
  // A stop token banned while the row has sampled fewer than its min_tokens.
  const at::Tensor ban = at::where(a.stopsFor.gt(double(a.step)), -std::numeric_limits<double>::infinity(), 0.0);
  y.index_put_({a.stopRows, a.stops}, ban.to(dtype), /*accumulate=*/true);
  return y;
}

// The step's tokens [n] counted for the next: frequency once more, presence if new.
void countSampled(TensorSampling::Adjustments& a, const at::Tensor& token) {
  a.step++;
  if (!a.penalize) return;
  const at::Tensor fresh = a.seen.eq(token.unsqueeze(1)).any(1).logical_not();
  const at::Tensor delta = a.penalties.select(1, 0).add(a.penalties.select(1, 1).mul(fresh.to(at::kDouble))).neg();
  a.rows = at::cat({a.rows, at::arange(token.size(0), token.options())});
  a.tokens = at::cat({a.tokens, token});
  a.deltas = at::cat({a.deltas, delta});
  a.seen = at::cat({a.seen, token.unsqueeze(1)}, 1);
}
}  // namespace

TensorSampling prepareTensorSampling(const std::vector<TensorSampleRow>& rows, int64_t V, const at::Device& dev) {
  // The rows' parameters in one host-to-device copy ([n, 6] fp64; the integers are exact), with
  // the host sampler's rules (sampler.h) for which filters apply.
  const int64_t n = int64_t(rows.size());
  std::vector<double> packed(size_t(n) * kCols, 0.0);
  TensorSampling out;
  for (int64_t i = 0; i < n; i++) {
    const SamplingParams& p = rows[i].params;
    const bool greedy = p.temperature <= 0, sorted = !greedy && visitsByProbability(p, V);
    double* r = packed.data() + i * kCols;
    r[kT] = greedy ? 1.0 : p.temperature;
    r[kMinP] = !greedy && filtersCandidates(p, V) ? p.minP : 0.0;
    r[kTopP] = sorted ? p.topP : 1.0;
    r[kTopK] = double(sorted && p.topK > 0 && p.topK < V ? p.topK : V);
    r[kGreedy] = greedy;
    r[kSorted] = sorted;
    out.anySorted = out.anySorted || sorted;
    out.topK = std::max(out.topK, std::min(rows[i].topLogprobs, V));
  }
  out.params = at::tensor(packed, at::TensorOptions().dtype(at::kDouble)).view({n, kCols}).to(dev);
  if (std::any_of(rows.begin(), rows.end(), [](const TensorSampleRow& r) { return r.adjust && r.adjust->active(); }))
    out.adjust = prepareAdjustments(rows, dev);
  return out;
}

at::Tensor sampleOnDevice(const at::Tensor& logitsIn, TensorSampling& setup, const at::Tensor& draw) {
  const at::Tensor x = setup.adjust ? adjusted(logitsIn.contiguous(), *setup.adjust) : logitsIn.contiguous();
  const int64_t V = x.size(1);
  const at::Tensor& params = setup.params;
  auto col = [&](Col c) { return params.select(1, c); };
  auto icol = [&](Col c) { return params.select(1, c).to(at::kLong); };
  const at::Tensor T = col(kT), greedyT = col(kGreedy).ne(0);

  // The host sampler's quantities: first maximum, e = exp((x - max) / T) (e[best] = 1), log sum e.
  const at::Tensor best = x.argmax(1);
  const at::Tensor mx = x.gather(1, best.unsqueeze(1));
  const at::Tensor bad = at::isnan(x).any(1).logical_or(at::isfinite(mx.squeeze(1)).logical_not());
  const at::Tensor e = (x - mx).div_(T.to(x.scalar_type()).unsqueeze(1)).exp_();
  const at::Tensor logNorm = e.sum(1, /*keepdim=*/false, at::kDouble).log_();

  // Token order (no filter, or min-p alone): inverse CDF over e with dropped tokens zeroed.
  const at::Tensor kept = e * e.ge(col(kMinP).to(e.scalar_type()).unsqueeze(1));
  const at::Tensor cdf = at::cumsum(kept, 1, at::kDouble);
  const at::Tensor mass = cdf.select(1, V - 1);
  at::Tensor token = firstAbove(cdf, draw * mass);
  // u within rounding of the mass: the host sampler takes the maximum.
  token = at::where(token.ge(V), best, token);

  if (setup.anySorted) {
    // Probability-descending order, ties by id (a stable sort keeps ids ascending among equals).
    // min-p keeps a prefix of it, top-k the first k, top-p the shortest prefix reaching its mass.
    auto [se, order] = at::sort(e, /*stable=*/true, /*dim=*/1, /*descending=*/true);
    const at::Tensor minKept = se.ge(col(kMinP).to(se.scalar_type()).unsqueeze(1)).sum(1);
    // >= 1 for a valid row (e[best] = 1 >= minP); clamped for the rows that are NaN.
    const at::Tensor len0 = at::minimum(minKept, icol(kTopK)).clamp_min_(1);
    const at::Tensor csum = at::cumsum(se, 1, at::kDouble);
    const at::Tensor kept0 = csum.gather(1, (len0 - 1).unsqueeze(1)).squeeze(1);
    // Shortest prefix whose mass reaches topP x kept0: first index with csum >= target, plus one.
    const at::Tensor reach =
        at::searchsorted(csum, (col(kTopP) * kept0).unsqueeze(1).contiguous(), false, /*right=*/false).squeeze(1) + 1;
    const at::Tensor len = at::where(col(kTopP).ge(1.0), len0, at::minimum(reach, len0));
    const at::Tensor m = csum.gather(1, (len - 1).unsqueeze(1)).squeeze(1);
    at::Tensor rank = firstAbove(csum, draw * m);
    rank = at::where(rank.ge(len), at::zeros_like(rank), rank);  // rounding: the host takes the first
    const at::Tensor sortedToken = order.gather(1, rank.unsqueeze(1)).squeeze(1);
    token = at::where(col(kSorted).ne(0), sortedToken, token);
  }
  token = at::where(greedyT, best, token);
  if (setup.adjust) countSampled(*setup.adjust, token);
  // log softmax(x / T)[token] over the full vocabulary (greedy: T = 1), as the host reports it.
  const at::Tensor logp = (x.gather(1, token.unsqueeze(1)).squeeze(1).to(at::kDouble) - mx.squeeze(1).to(at::kDouble))
                              .div_(T)
                              .sub_(logNorm);

  // Everything the host needs in one tensor: token, logprob, bad, then the top ids and logprobs.
  std::vector<at::Tensor> parts{token.to(at::kDouble).unsqueeze(1), logp.unsqueeze(1),
                                bad.to(at::kDouble).unsqueeze(1)};
  if (setup.topK > 0) {
    auto [top, topIds] = x.topk(setup.topK, 1, /*largest=*/true, /*sorted=*/true);
    // Ties in the host's order, lower id first: ids ascending, then a stable sort by value.
    auto [idsAsc, byId] = topIds.sort(1);
    auto [vals, byValue] = at::sort(top.gather(1, byId), /*stable=*/true, /*dim=*/1, /*descending=*/true);
    const at::Tensor ids = idsAsc.gather(1, byValue);
    parts.push_back(ids.to(at::kDouble));
    parts.push_back((vals.to(at::kDouble) - mx.to(at::kDouble)).div_(T.unsqueeze(1)).sub_(logNorm.unsqueeze(1)));
  }
  return at::cat(parts, 1);
}

TensorSampled readSampled(const at::Tensor& hostResult, const std::vector<TensorSampleRow>& rows, int64_t kTop) {
  const at::Tensor host = hostResult.contiguous();
  const double* h = host.data_ptr<double>();
  const int64_t n = host.size(0), W = host.size(1);
  TensorSampled out;
  out.sampled.resize(n);
  out.topIds.resize(n);
  out.topLogprobs.resize(n);
  for (int64_t i = 0; i < n; i++) {
    const double* r = h + i * W;
    if (r[2] != 0) {
      out.sampled[i] = {-1, std::numeric_limits<float>::quiet_NaN()};
      continue;
    }
    out.sampled[i] = {int64_t(r[0]), float(r[1])};
    if (rows[i].adjust) rows[i].adjust->sampled(int64_t(r[0]));
    for (int64_t j = 0; j < std::min(rows[i].topLogprobs, kTop); j++) {
      out.topIds[i].push_back(int32_t(r[3 + j]));
      out.topLogprobs[i].push_back(float(r[3 + kTop + j]));
    }
  }
  return out;
}

TensorSampled sampleWithTensorOps(const at::Tensor& logits, const std::vector<TensorSampleRow>& rows) {
  TensorSampling setup = prepareTensorSampling(rows, logits.size(1), logits.device());
  std::vector<double> draws(rows.size());
  for (size_t i = 0; i < rows.size(); i++) draws[i] = rows[i].draw;
  const at::Tensor draw = at::tensor(draws, at::TensorOptions().dtype(at::kDouble)).to(logits.device());
  // The copy is the step's one deliberate sync: the host needs the tokens (stop checks).
  return readSampled(sampleOnDevice(logits, setup, draw).cpu(), rows, setup.topK);
}

}  // namespace prime
