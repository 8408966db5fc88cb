#include "generator.h"

#include "host_parallel.h"
#include "tensor_sampler.h"

#include <ATen/Dispatch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace prime {

namespace {
// Rows [from, from + n) of one forward's routes as [n, sparse layers, K] int32, flattened.
std::vector<int32_t> routesOf(const MoeRouting& routing, const Model& model, int64_t from, int64_t n) {
  std::vector<at::Tensor> per;
  for (int64_t l : model.sparseLayers()) per.push_back(routing.experts.at(l).narrow(0, from, n));
  if (per.empty()) return {};
  at::Tensor all = at::stack(per, 1).to(at::kInt).cpu().contiguous();
  return std::vector<int32_t>(all.data_ptr<int32_t>(), all.data_ptr<int32_t>() + all.numel());
}
}  // namespace

Generator::Generator(std::shared_ptr<Model> m, int64_t maxSeqs, int64_t maxLen, bool tensorSampler, bool cudaGraphs)
    : maxSequences(maxSeqs), maxSequenceLength(maxLen), tensorSampler(tensorSampler), model(std::move(m)) {
  if (maxSeqs <= 0 || maxLen <= 1)
    throw std::runtime_error("generator needs maxSequences >= 1 and maxSequenceLength >= 2");
  const ArchConfig& c = model->cfg;
  cache_.slots = maxSeqs;
  cache_.maxLen = maxLen;
  for (int64_t l = 0; l < c.numLayers; l++) {
    // Zeroed: masked entries still enter probs @ V as 0 * v, and uninitialised memory may be NaN.
    cache_.k.push_back(at::zeros({maxSeqs, c.numKvHeads, maxLen, c.headDim}, model->options()));
    cache_.v.push_back(at::zeros({maxSeqs, c.numKvHeads, maxLen, c.headDim}, model->options()));
  }
  eagerReason_ = cudaGraphs ? DecodeGraphs::unsupported(*model) : "CUDA graphs are off for this generator";
  if (eagerReason_.empty()) graphs_ = std::make_unique<DecodeGraphs>(model, cache_);
}

std::string Generator::eagerReason() const {
  std::lock_guard<std::mutex> lock(reasonMutex_);
  return eagerReason_;
}

std::vector<AddedSequence> Generator::add(const std::vector<SequenceRequest>& requests) {
  c10::InferenceMode inference;
  // Validate the whole batch first so a bad request adds nothing.
  if (seqs_.size() + requests.size() > size_t(maxSequences))
    throw std::runtime_error("generator is full: " + std::to_string(seqs_.size()) + " active + " +
                             std::to_string(requests.size()) + " new > maxSequences " + std::to_string(maxSequences));
  for (const SequenceRequest& r : requests) {
    if (r.prompt.empty()) throw std::runtime_error("prompt must contain at least one token");
    if (int64_t(r.prompt.size()) > maxSequenceLength)
      throw std::runtime_error("prompt of " + std::to_string(r.prompt.size()) + " tokens exceeds maxSequenceLength " +
                               std::to_string(maxSequenceLength));
    if (r.maxTokens < 1) throw std::runtime_error("maxTokens must be >= 1");
    if (r.topLogprobs < 0 || r.topLogprobs > kMaxTopLogprobs)
      throw std::runtime_error("topLogprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "]");
    if (!(r.sampling.topP > 0 && r.sampling.topP <= 1)) throw std::runtime_error("topP must be in (0, 1]");
    if (r.sampling.temperature < 0 || r.sampling.minP < 0 || r.sampling.minP > 1)
      throw std::runtime_error("temperature must be >= 0 and minP in [0, 1]");
    model->checkTokenIds(r.prompt.data(), r.prompt.size());
  }
  // Prefill every prompt but its last token into its slot's cache (the last one is the first
  // decode step's input). The prompts are packed into forwards of at most kPrefillTokens tokens
  // (attention stays within each prompt), so admitting a batch costs a few large matmuls rather
  // than one small forward per request. Sequences are added only once every forward succeeded.
  const size_t first = seqs_.size();
  std::vector<AddedSequence> out(requests.size());
  std::vector<char> poisoned(requests.size(), 0);
  const auto longOpts = at::TensorOptions().dtype(at::kLong);
  size_t next = 0;
  try {
    while (next < requests.size()) {
      // The pack: requests [next, end) whose prompts need a forward (P > 1), up to the budget.
      std::vector<size_t> members;
      std::vector<int64_t> ids, pos, starts;
      bool routes = false;
      size_t end = next;
      for (; end < requests.size(); end++) {
        const std::vector<int64_t>& prompt = requests[end].prompt;
        const int64_t len = int64_t(prompt.size()) - 1;
        if (len == 0) continue;
        if (!members.empty() && int64_t(ids.size()) + len > kPrefillTokens) break;
        members.push_back(end);
        starts.push_back(int64_t(ids.size()));
        ids.insert(ids.end(), prompt.begin(), prompt.end() - 1);
        for (int64_t t = 0; t < len; t++) pos.push_back(t);
        routes = routes || requests[end].returnRoutes;
      }
      next = end;
      if (members.empty()) continue;
      std::vector<LayerKV> kv;
      MoeRouting routing;
      const at::Tensor hidden =
          model->forwardPacked(at::tensor(ids, longOpts).to(model->device), at::tensor(pos, longOpts).to(model->device),
                               starts, &kv, nullptr, nullptr, routes ? &routing : nullptr);
      // Non-finite keys or values make the hidden states non-finite: remember, so the slot is
      // cleared when the sequence leaves, even if it is removed before its first step. One host
      // read for the pack (deliberate: a per-prompt flag is needed on the host).
      const at::Tensor finite = at::isfinite(hidden).all(1).cpu();
      const bool* ok = finite.data_ptr<bool>();
      for (size_t m = 0; m < members.size(); m++) {
        const size_t i = members[m];
        const SequenceRequest& r = requests[i];
        const int64_t from = starts[m], len = int64_t(r.prompt.size()) - 1;
        const int64_t slot = int64_t(first + i);
        poisoned[i] = !std::all_of(ok + from, ok + from + len, [](bool b) { return b; });
        for (size_t l = 0; l < kv.size(); l++) {
          cache_.k[l][slot].narrow(1, 0, len).copy_(kv[l].first.narrow(0, from, len).transpose(0, 1));
          cache_.v[l][slot].narrow(1, 0, len).copy_(kv[l].second.narrow(0, from, len).transpose(0, 1));
        }
        if (r.returnRoutes) out[i].promptRoutes = routesOf(routing, *model, from, len);
        if (r.promptLogprobs) {
          // Raw (temperature 1) logprobs of prompt tokens 1..P-1, as vLLM's prompt_logprobs.
          out[i].promptLogprobs.assign(len + 1, std::numeric_limits<float>::quiet_NaN());
          std::vector<float> entropy(len);
          at::Tensor targets = at::tensor(std::vector<int64_t>(r.prompt.begin() + 1, r.prompt.end()), longOpts);
          model->tokenLogprobs(hidden.narrow(0, from, len), targets.to(model->device), 1.0,
                               out[i].promptLogprobs.data() + 1, entropy.data());
        }
      }
    }
  } catch (...) {
    // Nothing is added: clear what the forwards that did run wrote into the free slots (it may be
    // non-finite), so the slots' next sequences start from the zeroed cache the attention expects.
    for (size_t i = 0; i < requests.size(); i++) {
      const int64_t len = int64_t(requests[i].prompt.size()) - 1, slot = int64_t(first + i);
      for (size_t l = 0; len > 0 && l < cache_.k.size(); l++) {
        cache_.k[l][slot].narrow(1, 0, len).zero_();
        cache_.v[l][slot].narrow(1, 0, len).zero_();
      }
    }
    throw;
  }
  for (size_t i = 0; i < requests.size(); i++) {
    const SequenceRequest& r = requests[i];
    if (r.promptLogprobs && r.prompt.size() == 1)
      out[i].promptLogprobs.assign(1, std::numeric_limits<float>::quiet_NaN());
    out[i].seqId = nextId_;
    Sequence s{nextId_++,
               int64_t(r.prompt.size()) - 1,
               r.prompt.back(),
               0,
               r,
               std::mt19937_64(r.hasSeed ? r.seed : std::random_device{}()),
               bool(poisoned[i])};
    seqs_.push_back(std::move(s));
  }
  publishStats();
  return out;
}

std::vector<StepToken> Generator::step() {
  c10::InferenceMode inference;
  const int64_t n = int64_t(seqs_.size());
  if (n == 0) return {};
  std::vector<int64_t> ids(n), pos(n);
  int64_t keys = 0;  // cache positions the attention reads: up to the longest sequence's new token
  for (int64_t b = 0; b < n; b++) {
    ids[b] = seqs_[b].pending;
    pos[b] = seqs_[b].cacheLen;
    keys = std::max(keys, pos[b] + 1);
  }
  bool routes = false;
  for (const Sequence& s : seqs_) routes = routes || s.req.returnRoutes;
  MoeRouting routing;
  at::Tensor logits;
  if (graphs_ && !routes) {
    try {
      logits = graphs_->decode(ids, pos, keys);
      graphCount_ = graphs_->captured();
    } catch (const std::exception& e) {
      // A capture that fails (an operation CUDA cannot record) turns graphs off for this
      // generator; the step runs eagerly below and writes the same K/V again.
      std::lock_guard<std::mutex> lock(reasonMutex_);
      eagerReason_ = std::string("CUDA graph capture failed: ") + e.what();
      graphs_.reset();
      graphCount_ = 0;
      fprintf(stderr, "[prime-native] %s; decoding eagerly\n", eagerReason_.c_str());
    }
  }
  if (!logits.defined()) {
    const auto longOpts = at::TensorOptions().dtype(at::kLong);
    logits = model->decode(at::tensor(ids, longOpts).to(model->device), at::tensor(pos, longOpts).to(model->device),
                           keys, cache_, routes ? &routing : nullptr);
  }
  std::vector<Sampled> sampled(n);
  std::vector<StepToken> out(n);
  if (!logits.is_cpu() || tensorSampler) {
    // Logits on the device (CUDA): sampled there, only tokens and logprobs come back.
    std::vector<TensorSampleRow> rows(n);
    for (int64_t b = 0; b < n; b++) {
      Sequence& s = seqs_[b];
      rows[b].params = s.req.sampling;
      rows[b].topLogprobs = s.req.topLogprobs;
      if (s.req.sampling.temperature > 0) rows[b].draw = uniform53(s.rng);
    }
    TensorSampled ts = sampleWithTensorOps(logits, rows);
    sampled = std::move(ts.sampled);
    for (int64_t b = 0; b < n; b++) {
      out[b].topIds = std::move(ts.topIds[b]);
      out[b].topLogprobs = std::move(ts.topLogprobs[b]);
    }
  } else {
    sampleOnHost(logits, sampled, out);
  }
  finishStep(sampled, out, routing);
  return out;
}

void Generator::sampleOnHost(const at::Tensor& deviceLogits, std::vector<Sampled>& sampled,
                             std::vector<StepToken>& out) {
  // After the LM head, per row: the first maximum (a comparison pass), e = exp((x - max) / T)
  // vectorised for the batch (T = 1 for greedy rows), then the sampler's sum and inverse-CDF
  // scan over e. No log-softmax or probability tensor of the batch's size, no sort unless top-p
  // is on (sampler.h).
  const at::Tensor logits = deviceLogits.cpu().contiguous();
  const int64_t n = logits.size(0), V = logits.size(1);
  std::vector<int64_t> best(n);
  std::vector<double> temps(n), maxes(n, 0.0);
  for (int64_t b = 0; b < n; b++)
    temps[b] = seqs_[b].req.sampling.temperature > 0 ? seqs_[b].req.sampling.temperature : 1.0;
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "sample", [&] {
    const scalar_t* x = logits.data_ptr<scalar_t>();
    hostParallelFor(n, rowsGrain(V), [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; i++)
        if ((best[i] = rowArgmax(x + i * V, V)) >= 0) maxes[i] = double(x[i * V + best[i]]);
    });
    const auto opts = at::TensorOptions().dtype(at::kDouble);
    at::Tensor e = at::sub(logits, at::tensor(maxes, opts).to(logits.scalar_type()).unsqueeze(1))
                       .div_(at::tensor(temps, opts).to(logits.scalar_type()).unsqueeze(1))
                       .exp_();
    const scalar_t* ex = e.data_ptr<scalar_t>();
    // Rows are independent (own RNG each), so sampling in parallel stays deterministic.
    hostParallelFor(n, rowsGrain(V), [&](int64_t a, int64_t b) {
      std::vector<int32_t> order;
      for (int64_t i = a; i < b; i++) {
        if (best[i] < 0) {  // NaN row: nothing to sample, no top logprobs
          sampled[i] = {-1, std::numeric_limits<float>::quiet_NaN()};
          continue;
        }
        const RowLogits<scalar_t> row{x + i * V, ex + i * V, V, best[i], temps[i]};
        double logNorm = 0;
        sampled[i] = sampleToken(row, seqs_[i].req.sampling, seqs_[i].rng, order, &logNorm);
        if (seqs_[i].req.topLogprobs > 0)
          topLogprobs(row, logNorm, seqs_[i].req.topLogprobs, out[i].topIds, out[i].topLogprobs);
      }
    });
  });
}

void Generator::finishStep(const std::vector<Sampled>& sampled, std::vector<StepToken>& out,
                           const MoeRouting& routing) {
  const int64_t n = int64_t(seqs_.size());
  for (int64_t b = 0; b < n; b++) {
    Sequence& s = seqs_[b];
    out[b].seqId = s.id;
    if (sampled[b].token < 0) {
      // Non-finite logits (broken weights): this sequence ends with an error; the others go on.
      out[b].token = -1;
      out[b].logprob = sampled[b].logprob;
      out[b].finished = true;
      out[b].finishReason = "error";
      out[b].error = "the model produced non-finite logits (NaN or Inf): the served weights are broken";
      s.failed = true;
      continue;
    }
    if (s.req.returnRoutes) out[b].routes = routesOf(routing, *model, b, 1);
    s.cacheLen++;
    s.generated++;
    s.pending = sampled[b].token;
    const auto& stops = s.req.stopTokenIds;
    std::string reason;
    if (std::find(stops.begin(), stops.end(), s.pending) != stops.end()) reason = "stop";
    else if (s.generated >= s.req.maxTokens || s.cacheLen >= maxSequenceLength) reason = "length";
    out[b].token = s.pending;
    out[b].logprob = sampled[b].logprob;
    out[b].finished = !reason.empty();
    out[b].finishReason = reason;
  }
  // Walk backwards so the slot moved into a released one has already been looked at.
  for (int64_t b = n - 1; b >= 0; b--)
    if (out[b].finished) release(size_t(b));
  publishStats();
}

std::vector<bool> Generator::remove(const std::vector<int64_t>& seqIds) {
  c10::InferenceMode inference;
  std::vector<bool> removed;
  for (int64_t id : seqIds) {
    auto it = std::find_if(seqs_.begin(), seqs_.end(), [&](const Sequence& s) { return s.id == id; });
    removed.push_back(it != seqs_.end());
    if (it != seqs_.end()) release(size_t(it - seqs_.begin()));
  }
  publishStats();
  return removed;
}

void Generator::release(size_t slot) {
  const size_t last = seqs_.size() - 1;
  if (seqs_[slot].failed) {
    // Its K/V (positions 0..cacheLen) may be NaN. Masked attention (SDPA on GPU / bf16) still
    // multiplies stale entries by 0, and 0 * NaN = NaN: clear them so the slot's next sequence,
    // under repaired weights, is not poisoned.
    const int64_t len = std::min(seqs_[slot].cacheLen + 1, maxSequenceLength);
    for (size_t l = 0; l < cache_.k.size(); l++) {
      cache_.k[l][slot].narrow(1, 0, len).zero_();
      cache_.v[l][slot].narrow(1, 0, len).zero_();
    }
  }
  if (slot != last) {
    const int64_t len = seqs_[last].cacheLen;
    for (size_t l = 0; l < cache_.k.size(); l++) {
      cache_.k[l][slot].narrow(1, 0, len).copy_(cache_.k[l][last].narrow(1, 0, len));
      cache_.v[l][slot].narrow(1, 0, len).copy_(cache_.v[l][last].narrow(1, 0, len));
    }
    seqs_[slot] = std::move(seqs_[last]);
  }
  seqs_.pop_back();
}

void Generator::publishStats() {
  int64_t cached = 0;
  for (const Sequence& s : seqs_) cached += s.cacheLen;
  active_ = int64_t(seqs_.size());
  cached_ = cached;
}

}  // namespace prime
