#include "model_runner.h"

#include "host_parallel.h"
#include "tensor_sampler.h"

#include <ATen/Dispatch.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace prime {

namespace {
const auto kLongOpts = at::TensorOptions().dtype(at::kLong);
int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

ModelRunner::ModelRunner(std::shared_ptr<Model> model, CacheManager& cache, const GeneratorOptions& o, StepTimes& times)
    : model_(std::move(model)), cache_(cache), maxSequenceLength_(o.maxSequenceLength), blockSize_(o.blockSize),
      tensorSampler_(o.tensorSampler), pagedAttentionKernel_(o.pagedAttentionKernel), times_(times) {
  eagerReason_ = o.cudaGraphs ? DecodeGraphs::unsupported(*model_) : "CUDA graphs are off for this generator";
  if (eagerReason_.empty())
    graphs_ = std::make_unique<DecodeGraphs>(model_, cache_.paged(), cache_.states(), o.maxSequences,
                                             ceilDiv(maxSequenceLength_, blockSize_), pagedAttentionKernel_);
}

std::string ModelRunner::eagerReason() const {
  std::lock_guard<std::mutex> lock(reasonMutex_);
  return eagerReason_;
}

std::vector<int32_t> ModelRunner::routes(const MoeRouting& routing, int64_t from, int64_t n) const {
  std::vector<at::Tensor> per;
  for (int64_t l : model_->sparseLayers()) per.push_back(routing.experts.at(l).narrow(0, from, n));
  if (per.empty()) return {};
  at::Tensor all = at::stack(per, 1).to(at::kInt).cpu().contiguous();
  return std::vector<int32_t>(all.data_ptr<int32_t>(), all.data_ptr<int32_t>() + all.numel());
}

ModelRunner::Mixed ModelRunner::forwardMixed(const StepPlan& p, Laps& lap) {
  Mixed f;
  const int64_t nd = int64_t(p.decode.size());
  for (Sequence* s : p.decode) f.rows.push_back({s, s->computed, s->computed + 1});
  for (auto& [s, n] : p.chunks) f.rows.push_back({s, s->computed, s->computed + n});
  int64_t width = 1;
  for (const SequenceWrite& w : f.rows) width = std::max(width, int64_t(w.seq->cache.blocks.size()));
  const PagedKV& kv = cache_.paged();
  std::vector<int64_t> ids, pos, seqOf;
  std::vector<int64_t> tables(f.rows.size() * size_t(width), kv.nullBlock());
  PagedBatch batch;
  batch.decodeRows = nd;
  for (size_t r = 0; r < f.rows.size(); r++) {
    const SequenceWrite& w = f.rows[r];
    const Sequence& s = *w.seq;
    f.first.push_back(int64_t(ids.size()));
    for (int64_t t = w.from; t < w.to; t++) {
      ids.push_back(s.tokens[t]);
      pos.push_back(t);
      seqOf.push_back(int64_t(r));
    }
    std::copy(s.cache.blocks.begin(), s.cache.blocks.end(), tables.begin() + int64_t(r) * width);
    if (int64_t(r) < nd) {
      batch.decodeKeys = std::max(batch.decodeKeys, w.to);
    } else {
      batch.chunkStart.push_back(w.from);
      batch.chunkLen.push_back(w.to - w.from);
    }
  }
  const int64_t N = int64_t(ids.size());
  const at::Device dev = model_->device;
  batch.pos = at::tensor(pos, kLongOpts).to(dev);
  batch.seqOf = at::tensor(seqOf, kLongOpts).to(dev);
  batch.tables = at::tensor(tables, kLongOpts).view({int64_t(f.rows.size()), width}).to(dev);
  bool routes = false;
  for (const SequenceWrite& w : f.rows) routes = routes || w.seq->req.returnRoutes;
  const at::Tensor idsT = at::tensor(ids, kLongOpts).to(dev);
  batch.attentionSeconds = &times_.attention;
  batch.decodeKernel = pagedAttentionKernel_;
  const CacheManager::StepState st = cache_.beginForward(f.rows, nd);
  if (cache_.states()) {
    batch.slotOf = at::tensor(st.slotOf, kLongOpts).to(dev);
    batch.snapshots = st.snapshots;
  }
  lap(times_.inputs);
  f.device = std::make_unique<DeviceTimer>(dev);
  f.hidden = model_->forwardPaged(idsT, batch, cache_.paged(), routes ? &f.routing : nullptr, cache_.states());
  cache_.probeUpdate(idsT, f.rows, nd, st);
  cache_.endForward();
  lap(times_.forward);
  times_.steps++;

  // Non-finite K/V of a chunk make its hidden states non-finite: its sequence has failed (its
  // blocks are cleared when it leaves, even if it is removed before it samples). One host read
  // per step with chunks (deliberate: the flag is needed on the host).
  const at::Tensor finite = at::isfinite(f.hidden.narrow(0, nd, N - nd)).all(1).cpu();
  const bool* ok = finite.data_ptr<bool>();
  for (size_t r = size_t(nd); r < f.rows.size(); r++) {
    const SequenceWrite& w = f.rows[r];
    Sequence& s = *w.seq;
    const int64_t from = f.first[r] - nd, len = w.to - w.from;
    if (!std::all_of(ok + from, ok + from + len, [](bool b) { return b; })) s.failed = true;
    // The prompt's own outputs, for positions with a next prompt token (the last prompt token's
    // are its first sampled token's).
    if (!s.needsPromptOutputs()) continue;
    const int64_t start = w.from, upTo = std::min(w.to, s.promptLen - 1);
    if (upTo <= start) continue;
    if (s.req.promptLogprobs) {
      if (s.promptLogprobs.empty())
        s.promptLogprobs.assign(size_t(s.promptLen), std::numeric_limits<float>::quiet_NaN());
      std::vector<float> entropy(static_cast<size_t>(upTo - start));
      const at::Tensor targets =
          at::tensor(std::vector<int64_t>(s.tokens.begin() + start + 1, s.tokens.begin() + upTo + 1), kLongOpts);
      model_->tokenLogprobs(f.hidden.narrow(0, f.first[r], upTo - start), targets.to(dev), 1.0,
                            s.promptLogprobs.data() + start + 1, entropy.data());
    }
    if (s.req.returnRoutes) {
      const std::vector<int32_t> r2 = this->routes(f.routing, f.first[r], upTo - start);
      s.promptRoutes.insert(s.promptRoutes.end(), r2.begin(), r2.end());
    }
  }
  return f;
}

void ModelRunner::sampleMixed(Mixed& f, const std::vector<Sequence*>& seqs, const std::vector<int64_t>& rows,
                              std::vector<Sampled>& sampled, std::vector<StepToken>& out, Laps& lap) {
  const at::Tensor rowsT = at::tensor(rows, kLongOpts).to(model_->device);
  sampleLogits(seqs, model_->logits(f.hidden.index_select(0, rowsT)), sampled, out);
  f.device->end();
  times_.device += f.device->seconds();
  lap(times_.sample);
  for (size_t i = 0; i < seqs.size(); i++)
    if (seqs[i]->req.returnRoutes) out[i].routes = routes(f.routing, rows[i], 1);
}

ModelRunner::Decoded ModelRunner::decode(const StepPlan& p, Laps& lap) {
  const int64_t n = int64_t(p.decode.size()), k = p.steps;
  const at::Device dev = model_->device;
  bool routes = false;
  for (Sequence* s : p.decode) routes = routes || s->req.returnRoutes;
  const bool viaGraphs = graphs_ && !routes;
  // Graphs read tables of one width (the longest sequence's); eager steps the widest row's.
  int64_t width = ceilDiv(maxSequenceLength_, blockSize_);
  if (!viaGraphs) {
    width = 1;
    for (Sequence* s : p.decode) width = std::max(width, int64_t(s->cache.blocks.size()));
  }
  // The rows each step feeds (positions [from, to) of each sequence), for the state side.
  std::vector<SequenceWrite> fed;
  for (Sequence* s : p.decode) fed.push_back({s, s->computed, s->computed + 1});
  const CacheManager::StepState st = cache_.beginForward(fed, n);
  LinearStates* states = cache_.states();
  // One host-to-device copy: [n, lead + width] = token, position, (hybrid: state slot,) block table.
  const int64_t lead = states ? 3 : 2, cols = lead + width;
  std::vector<int64_t> host(static_cast<size_t>(n * cols), cache_.paged().nullBlock());
  int64_t keys = 0;
  for (int64_t b = 0; b < n; b++) {
    const Sequence& s = *p.decode[b];
    int64_t* row = host.data() + b * cols;
    row[0] = s.tokens.back();
    row[1] = s.computed;
    if (states) row[2] = st.slotOf[size_t(b)];
    std::copy(s.cache.blocks.begin(), s.cache.blocks.end(), row + lead);
    keys = std::max(keys, s.computed + 1);
  }
  const at::Tensor in = at::tensor(host, kLongOpts).view({n, cols}).to(dev);
  at::Tensor ids = in.select(1, 0).contiguous(), pos = in.select(1, 1).contiguous();
  const at::Tensor slots = states ? in.select(1, 2).contiguous() : at::Tensor();
  const at::Tensor tables = in.narrow(1, lead, width).contiguous();
  const at::Tensor seqOf = at::arange(n, kLongOpts.device(dev));
  lap(times_.inputs);
  DeviceTimer device(dev);

  // Sampling with tensor ops (CUDA; the CPU when asked): each step's rows are sampled on the
  // device and its tokens fed to the next step there, every step's results read in one copy at
  // the end. Each sequence's uniforms are drawn in its order of steps, as step-by-step sampling
  // draws them, so its tokens are the same whatever the number of steps per call.
  const bool onDevice = !dev.is_cpu() || tensorSampler_;
  std::vector<TensorSampleRow> rows(static_cast<size_t>(n));
  TensorSampling setup;
  at::Tensor draws;
  if (onDevice) {
    std::vector<double> u(static_cast<size_t>(k * n), 0.0);
    for (int64_t b = 0; b < n; b++) {
      Sequence& s = *p.decode[b];
      rows[b].params = s.req.sampling;
      rows[b].topLogprobs = s.req.topLogprobs;
      rows[b].adjust = &s.adjust;
      if (s.req.sampling.temperature > 0)
        for (int64_t j = 0; j < k; j++) u[size_t(j * n + b)] = uniform53(s.rng);
    }
    setup = prepareTensorSampling(rows, model_->cfg.vocabSize, dev);
    draws = at::tensor(u, at::TensorOptions().dtype(at::kDouble)).view({k, n}).to(dev);
  }
  Decoded d;
  d.sampled.assign(size_t(k), std::vector<Sampled>(size_t(n)));
  d.outs.assign(size_t(k), std::vector<StepToken>(size_t(n)));
  d.routing.resize(size_t(k));
  std::vector<at::Tensor> results;
  for (int64_t j = 0; j < k; j++) {
    at::Tensor logits;
    if (graphs_ && viaGraphs) {
      try {
        logits = graphs_->decode(ids, pos, tables, slots, keys + j);
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
      PagedBatch batch;
      batch.pos = pos;
      batch.seqOf = seqOf;
      batch.tables = tables;
      batch.decodeRows = n;
      batch.decodeKeys = keys + j;
      batch.attentionSeconds = &times_.attention;
      batch.decodeKernel = pagedAttentionKernel_;
      batch.slotOf = slots;
      logits = model_->logits(
          model_->forwardPaged(ids, batch, cache_.paged(), routes ? &d.routing[size_t(j)] : nullptr, states));
    }
    if (j > 0)
      for (SequenceWrite& w : fed) w.from = ++w.to - 1;
    cache_.probeUpdate(ids, fed, n, st);
    lap(times_.forward);
    times_.steps++;
    if (onDevice) {
      results.push_back(sampleOnDevice(logits, setup, draws[j]));
      if (j + 1 < k) ids = results.back().select(1, 0).to(at::kLong);
    } else {
      sampleLogits(p.decode, logits, d.sampled[size_t(j)], d.outs[size_t(j)]);
      if (j + 1 < k) {
        std::vector<int64_t> next(static_cast<size_t>(n));
        for (int64_t b = 0; b < n; b++) next[b] = std::max<int64_t>(d.sampled[size_t(j)][b].token, 0);
        ids = at::tensor(next, kLongOpts).to(dev);
      }
    }
    if (j + 1 < k) pos = pos + 1;
    lap(times_.sample);
  }
  cache_.endForward();
  device.end();
  if (onDevice) {
    // The call's one deliberate sync: the host needs the tokens (stop checks, the response).
    const at::Tensor all = at::stack(results).cpu();
    for (int64_t j = 0; j < k; j++) {
      TensorSampled ts = readSampled(all[j], rows, setup.topK);
      d.sampled[size_t(j)] = std::move(ts.sampled);
      for (int64_t b = 0; b < n; b++) {
        d.outs[size_t(j)][b].topIds = std::move(ts.topIds[b]);
        d.outs[size_t(j)][b].topLogprobs = std::move(ts.topLogprobs[b]);
      }
    }
  }
  times_.device += device.seconds();
  lap(times_.sample);
  return d;
}

void ModelRunner::sampleLogits(const std::vector<Sequence*>& seqs, const at::Tensor& logits,
                               std::vector<Sampled>& sampled, std::vector<StepToken>& out) {
  const int64_t n = int64_t(seqs.size());
  if (!logits.is_cpu() || tensorSampler_) {
    // Logits on the device (CUDA): sampled there, only tokens and logprobs come back.
    std::vector<TensorSampleRow> rows(static_cast<size_t>(n));
    for (int64_t b = 0; b < n; b++) {
      Sequence& s = *seqs[b];
      rows[b].params = s.req.sampling;
      rows[b].topLogprobs = s.req.topLogprobs;
      rows[b].adjust = &s.adjust;
      if (s.req.sampling.temperature > 0) rows[b].draw = uniform53(s.rng);
    }
    TensorSampled ts = sampleWithTensorOps(logits, rows);
    sampled = std::move(ts.sampled);
    for (int64_t b = 0; b < n; b++) {
      out[b].topIds = std::move(ts.topIds[b]);
      out[b].topLogprobs = std::move(ts.topLogprobs[b]);
    }
    return;
  }
  // On the host, per row (sampler.h): the first maximum and the sums of e = exp((x - max) / T) by
  // blocks (T = 1 for greedy rows; prepareRow's one vectorised pass), then the sampler's
  // inverse-CDF scan over the blocks; e itself only for rows that filter candidates. No
  // log-softmax or probability tensor of the batch's size, no sort unless top-p is on. Rows are
  // split between the host threads, each with its own workspace.
  at::Tensor x0 = logits.contiguous();
  const int64_t V = x0.size(1);
  // Logit bias, min_tokens and penalties (sampler.h) change a row before anything reads it: a copy.
  if (std::any_of(seqs.begin(), seqs.end(), [](const Sequence* s) { return s->adjust.active(); })) {
    x0 = x0.clone();
    AT_DISPATCH_FLOATING_TYPES(x0.scalar_type(), "adjust", [&] {
      for (int64_t i = 0; i < n; i++) seqs[i]->adjust.apply(x0.data_ptr<scalar_t>() + i * V);
    });
  }
  AT_DISPATCH_FLOATING_TYPES(x0.scalar_type(), "sample", [&] {
    const scalar_t* x = x0.data_ptr<scalar_t>();
    // Rows are independent (own RNG each), so sampling in parallel stays deterministic.
    hostParallelFor(n, rowsGrain(V), [&](int64_t a, int64_t b) {
      std::vector<scalar_t> e;  // for rows whose sampling filters candidates
      std::vector<double> blockSums(static_cast<size_t>(sampleBlocks(V)));
      std::vector<int32_t> order;
      for (int64_t i = a; i < b; i++) {
        Sequence& s = *seqs[i];
        const double T = s.req.sampling.temperature > 0 ? s.req.sampling.temperature : 1.0;
        const bool filtered = s.req.sampling.temperature > 0 && filtersCandidates(s.req.sampling, V);
        if (filtered) e.resize(static_cast<size_t>(V));
        const int64_t best = prepareRow(x + i * V, V, T, filtered ? e.data() : nullptr, blockSums.data());
        if (best < 0) {  // NaN row: nothing to sample, no top logprobs
          sampled[i] = {-1, std::numeric_limits<float>::quiet_NaN()};
          continue;
        }
        const RowLogits<scalar_t> row{x + i * V, filtered ? e.data() : nullptr, blockSums.data(), V, best, T};
        double logNorm = 0;
        sampled[i] = sampleToken(row, s.req.sampling, s.rng, order, &logNorm);
        s.adjust.sampled(sampled[i].token);
        if (s.req.topLogprobs > 0) topLogprobs(row, logNorm, s.req.topLogprobs, out[i].topIds, out[i].topLogprobs);
      }
    });
  });
}

}  // namespace prime
