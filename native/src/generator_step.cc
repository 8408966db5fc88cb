// The generator's steps: which rows run (a decode row per decoding sequence, prefill chunks in
// the rest of the token budget; preemption when the pool cannot hold their writes), the forward
// over the paged cache, sampling, and what each sampled token ends. Sequences and blocks:
// generator.cc.
#include "generator.h"

#include "cuda_info.h"
#include "host_parallel.h"
#include "tensor_sampler.h"

#include <ATen/Dispatch.h>

#include <algorithm>
#include <chrono>
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

const auto kLongOpts = at::TensorOptions().dtype(at::kLong);
}  // namespace

// Splits a step's time into its parts: each call adds the time since the previous one to a part.
struct Generator::Laps {
  std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
  void operator()(double& part) {
    const auto now = std::chrono::steady_clock::now();
    part += std::chrono::duration<double>(now - t).count();
    t = now;
  }
};

struct Generator::Plan {
  std::vector<Sequence*> decode;                      // one row each, first in the batch
  std::vector<std::pair<Sequence*, int64_t>> chunks;  // prefill: tokens [computed, computed + n)
  int64_t steps = 1;                                  // decode steps in this call (decode rows only)
};

std::vector<StepToken> Generator::step(int64_t maxSteps) {
  c10::InferenceMode inference;
  if (maxSteps < 1) throw std::runtime_error("maxSteps must be >= 1");
  Laps lap;
  syncEpoch();
  resumePreempted();
  Plan p = plan(maxSteps);
  lap(times_.plan);
  std::vector<StepToken> out;
  if (!p.chunks.empty()) out = runMixed(p, lap);
  else if (!p.decode.empty()) out = runDecode(p, lap);
  if (!p.chunks.empty() || !p.decode.empty()) times_.calls++;
  publishStats();
  return out;
}

bool Generator::copiesOnWrite(const Sequence& s, int32_t block) const {
  // Others read it; a leader writes in place what its waiting followers wait for.
  return pool_->refs(block) > 1 && !hasWaitingFollowers(s.id);
}

int64_t Generator::blocksNeeded(const Sequence& s, int64_t from, int64_t to) const {
  int64_t need = 0;
  for (int64_t j = from / blockSize; j * blockSize < to; j++)
    need += j >= int64_t(s.blocks.size()) || copiesOnWrite(s, s.blocks[j]);
  return need;
}

void Generator::prepareWrites(Sequence& s, int64_t from, int64_t to) {
  for (int64_t j = from / blockSize; j * blockSize < to; j++) {
    if (j >= int64_t(s.blocks.size())) {
      s.blocks.push_back(pool_->take());
    } else if (copiesOnWrite(s, s.blocks[j])) {
      const int32_t old = s.blocks[j], fresh = pool_->take();
      for (size_t l = 0; l < cache_.k.size(); l++) {
        cache_.k[l][fresh].copy_(cache_.k[l][old]);
        cache_.v[l][fresh].copy_(cache_.v[l][old]);
      }
      if (pool_->release(old)) zeroBlock(old);  // (still referenced by the others)
      s.blocks[j] = fresh;
    } else if (prefixes_->holdsComputed(s.blocks[j])) {
      // Its own now (a sequence computing its cached last position again): rewritten in place,
      // it leaves the index until it is computed again (indexComputed).
      prefixes_->forget(s.blocks[j]);
    }
  }
}

Generator::Plan Generator::plan(int64_t maxSteps) {
  for (;;) {
    Plan p;
    bool onlyDecode = preempted_.empty();
    int64_t budget = maxBatchedTokens;
    for (const SeqPtr& s : running_) {
      if (s->leader == 0 && s->computed == int64_t(s->tokens.size()) - 1) {
        p.decode.push_back(s.get());
        budget--;
      } else {
        onlyDecode = false;
      }
    }
    for (const SeqPtr& s : running_) {
      const int64_t left = int64_t(s->tokens.size()) - s->computed;
      if (s->leader != 0 || left < 2 || budget <= 0) continue;
      p.chunks.emplace_back(s.get(), std::min(left, budget));
      budget -= p.chunks.back().second;
    }
    if (onlyDecode && maxSteps > 1 && !p.decode.empty()) {
      // As many steps as no sequence can end by its max tokens or the length limit before the last.
      p.steps = maxSteps;
      for (Sequence* s : p.decode)
        p.steps = std::min({p.steps, s->req.maxTokens - s->generated, maxSequenceLength - s->computed});
      p.steps = std::max<int64_t>(p.steps, 1);
    }
    int64_t need = 0;
    for (Sequence* s : p.decode) need += blocksNeeded(*s, s->computed, s->computed + p.steps);
    for (auto& [s, n] : p.chunks) need += blocksNeeded(*s, s->computed, s->computed + n);
    if (need <= pool_->available()) {
      for (Sequence* s : p.decode) prepareWrites(*s, s->computed, s->computed + p.steps);
      for (auto& [s, n] : p.chunks) prepareWrites(*s, s->computed, s->computed + n);
      return p;
    }
    if (p.steps > 1) {
      maxSteps = 1;
      continue;
    }
    // The pool cannot hold this step's writes: the lowest-priority sequence (the latest admitted
    // among equals) gives its blocks back and is recomputed later. One sequence alone always fits
    // (validate), so this ends.
    if (running_.size() <= 1) throw std::logic_error("KV cache: a lone sequence does not fit the pool");
    preempt(running_.size() - 1, /*counted=*/true);
  }
}

std::vector<StepToken> Generator::runMixed(Plan& p, Laps& lap) {
  const int64_t nd = int64_t(p.decode.size());
  std::vector<Sequence*> segs(p.decode);
  std::vector<int64_t> lens(static_cast<size_t>(nd), 1);
  for (auto& [s, n] : p.chunks) {
    segs.push_back(s);
    lens.push_back(n);
  }
  int64_t width = 1;
  for (Sequence* s : segs) width = std::max(width, int64_t(s->blocks.size()));
  std::vector<int64_t> ids, pos, seqOf, starts(segs.size()), rowOf(segs.size());
  std::vector<int64_t> tables(segs.size() * size_t(width), cache_.nullBlock());
  PagedBatch batch;
  batch.decodeRows = nd;
  for (size_t r = 0; r < segs.size(); r++) {
    const Sequence& s = *segs[r];
    starts[r] = s.computed;
    rowOf[r] = int64_t(ids.size());
    for (int64_t t = 0; t < lens[r]; t++) {
      ids.push_back(s.tokens[s.computed + t]);
      pos.push_back(s.computed + t);
      seqOf.push_back(int64_t(r));
    }
    std::copy(s.blocks.begin(), s.blocks.end(), tables.begin() + int64_t(r) * width);
    if (int64_t(r) < nd) batch.decodeKeys = std::max(batch.decodeKeys, s.computed + 1);
    else {
      batch.chunkStart.push_back(s.computed);
      batch.chunkLen.push_back(lens[r]);
    }
  }
  const int64_t N = int64_t(ids.size());
  const at::Device dev = model->device;
  batch.pos = at::tensor(pos, kLongOpts).to(dev);
  batch.seqOf = at::tensor(seqOf, kLongOpts).to(dev);
  batch.tables = at::tensor(tables, kLongOpts).view({int64_t(segs.size()), width}).to(dev);
  bool routes = false;
  for (Sequence* s : segs) routes = routes || s->req.returnRoutes;
  MoeRouting routing;
  const at::Tensor idsT = at::tensor(ids, kLongOpts).to(dev);
  batch.attentionSeconds = &times_.attention;
  batch.decodeKernel = pagedAttentionKernel;
  lap(times_.inputs);
  DeviceTimer device(dev);
  const at::Tensor hidden = model->forwardPaged(idsT, batch, cache_, routes ? &routing : nullptr);
  lap(times_.forward);
  prefillTokens_ += N - nd;
  for (int64_t r = 0; r < nd; r++) prefillTokens_ += segs[r]->computed < segs[r]->promptLen;  // a prompt's last
  times_.steps++;

  // Non-finite K/V of a chunk make its hidden states non-finite: its sequence has failed (its
  // blocks are cleared when it leaves, even if it is removed before it samples). One host read
  // per step with chunks (deliberate: the flag is needed on the host).
  const at::Tensor finite = at::isfinite(hidden.narrow(0, nd, N - nd)).all(1).cpu();
  const bool* ok = finite.data_ptr<bool>();
  for (size_t r = size_t(nd); r < segs.size(); r++) {
    Sequence& s = *segs[r];
    const int64_t from = rowOf[r] - nd;
    if (!std::all_of(ok + from, ok + from + lens[r], [](bool b) { return b; })) s.failed = true;
    // The prompt's own outputs, for positions with a next prompt token (the last prompt token's
    // are its first sampled token's).
    if (!s.needsPromptOutputs()) continue;
    const int64_t start = starts[r], upTo = std::min(start + lens[r], s.promptLen - 1);
    if (upTo <= start) continue;
    if (s.req.promptLogprobs) {
      if (s.promptLogprobs.empty())
        s.promptLogprobs.assign(size_t(s.promptLen), std::numeric_limits<float>::quiet_NaN());
      std::vector<float> entropy(static_cast<size_t>(upTo - start));
      const at::Tensor targets =
          at::tensor(std::vector<int64_t>(s.tokens.begin() + start + 1, s.tokens.begin() + upTo + 1), kLongOpts);
      model->tokenLogprobs(hidden.narrow(0, rowOf[r], upTo - start), targets.to(dev), 1.0,
                           s.promptLogprobs.data() + start + 1, entropy.data());
    }
    if (s.req.returnRoutes) {
      const std::vector<int32_t> r2 = routesOf(routing, *model, rowOf[r], upTo - start);
      s.promptRoutes.insert(s.promptRoutes.end(), r2.begin(), r2.end());
    }
  }

  // The rows sampled: decode rows, chunks that reached their sequence's last token, and followers
  // whose leader computed their shared prefix in this step (from the leader's row for their last
  // token when that prefix is all their tokens).
  std::vector<Sequence*> sampleSeqs;
  std::vector<int64_t> sampleRows;
  for (size_t r = 0; r < segs.size(); r++) {
    Sequence& s = *segs[r];
    s.computed += lens[r];
    if (s.computed == int64_t(s.tokens.size())) {
      sampleSeqs.push_back(&s);
      sampleRows.push_back(rowOf[r] + lens[r] - 1);
    }
  }
  for (const SeqPtr& f : running_) {
    if (f->leader == 0) continue;
    auto at = std::find_if(segs.begin(), segs.end(), [&](Sequence* s) { return s->id == f->leader; });
    if (at == segs.end() || (*at)->computed < f->sharedLen) continue;
    const size_t r = size_t(at - segs.begin());
    // With all its tokens shared, its last token's row is the leader's, computed now; were it
    // not (never expected), it computes that position again itself.
    const bool allShared = f->sharedLen == int64_t(f->tokens.size()), rowHere = f->sharedLen - 1 >= starts[r];
    f->computed = std::max(f->computed, allShared && !rowHere ? f->sharedLen - 1 : f->sharedLen);
    if (segs[r]->failed) f->failed = true;
    if (allShared && rowHere) {
      sampleSeqs.push_back(f.get());
      sampleRows.push_back(rowOf[r] + (f->sharedLen - 1 - starts[r]));
    }
    f->leader = f->sharedLen = 0;
  }

  std::vector<StepToken> out(sampleSeqs.size());
  if (!sampleSeqs.empty()) {
    const at::Tensor rowsT = at::tensor(sampleRows, kLongOpts).to(dev);
    std::vector<Sampled> sampled(sampleSeqs.size());
    sampleLogits(sampleSeqs, model->logits(hidden.index_select(0, rowsT)), sampled, out);
    device.end();
    times_.device += device.seconds();
    lap(times_.sample);
    for (size_t i = 0; i < sampleSeqs.size(); i++) {
      if (sampleSeqs[i]->req.returnRoutes) out[i].routes = routesOf(routing, *model, sampleRows[i], 1);
      applyToken(*sampleSeqs[i], sampled[i], out[i]);
    }
  }
  lap(times_.sample);  // (when nothing was sampled: the prompts' outputs)
  for (const SeqPtr& s : running_) indexComputed(*s);
  retire(out);
  lap(times_.finish);
  return out;
}

std::vector<StepToken> Generator::runDecode(Plan& p, Laps& lap) {
  const int64_t n = int64_t(p.decode.size()), k = p.steps;
  const at::Device dev = model->device;
  bool routes = false;
  for (Sequence* s : p.decode) routes = routes || s->req.returnRoutes;
  const bool viaGraphs = graphs_ && !routes;
  // Graphs read tables of one width (the longest sequence's); eager steps the widest row's.
  int64_t width = (maxSequenceLength + blockSize - 1) / blockSize;
  if (!viaGraphs) {
    width = 1;
    for (Sequence* s : p.decode) width = std::max(width, int64_t(s->blocks.size()));
  }
  // One host-to-device copy: [n, 2 + width] = token, position, block table.
  std::vector<int64_t> host(static_cast<size_t>(n * (2 + width)), cache_.nullBlock());
  int64_t keys = 0;
  for (int64_t b = 0; b < n; b++) {
    const Sequence& s = *p.decode[b];
    int64_t* row = host.data() + b * (2 + width);
    row[0] = s.tokens.back();
    row[1] = s.computed;
    std::copy(s.blocks.begin(), s.blocks.end(), row + 2);
    keys = std::max(keys, s.computed + 1);
  }
  const at::Tensor in = at::tensor(host, kLongOpts).view({n, 2 + width}).to(dev);
  at::Tensor ids = in.select(1, 0).contiguous(), pos = in.select(1, 1).contiguous();
  const at::Tensor tables = in.narrow(1, 2, width).contiguous();
  const at::Tensor seqOf = at::arange(n, kLongOpts.device(dev));
  for (Sequence* s : p.decode) prefillTokens_ += s->computed < s->promptLen;  // a prompt's last position
  lap(times_.inputs);
  DeviceTimer device(dev);

  // Sampling with tensor ops (CUDA; the CPU when asked): each step's rows are sampled on the
  // device and its tokens fed to the next step there, every step's results read in one copy at
  // the end. Each sequence's uniforms are drawn in its order of steps, as step-by-step sampling
  // draws them, so its tokens are the same whatever the number of steps per call.
  const bool onDevice = !dev.is_cpu() || tensorSampler;
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
    setup = prepareTensorSampling(rows, model->cfg.vocabSize, dev);
    draws = at::tensor(u, at::TensorOptions().dtype(at::kDouble)).view({k, n}).to(dev);
  }
  std::vector<std::vector<Sampled>> sampled(static_cast<size_t>(k), std::vector<Sampled>(size_t(n)));
  std::vector<std::vector<StepToken>> outs(static_cast<size_t>(k), std::vector<StepToken>(size_t(n)));
  std::vector<MoeRouting> routing(static_cast<size_t>(k));
  std::vector<at::Tensor> results;
  for (int64_t j = 0; j < k; j++) {
    at::Tensor logits;
    if (graphs_ && viaGraphs) {
      try {
        logits = graphs_->decode(ids, pos, tables, keys + j);
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
      batch.decodeKernel = pagedAttentionKernel;
      logits = model->logits(model->forwardPaged(ids, batch, cache_, routes ? &routing[j] : nullptr));
    }
    lap(times_.forward);
    times_.steps++;
    if (onDevice) {
      results.push_back(sampleOnDevice(logits, setup, draws[j]));
      if (j + 1 < k) ids = results.back().select(1, 0).to(at::kLong);
    } else {
      sampleLogits(p.decode, logits, sampled[j], outs[j]);
      if (j + 1 < k) {
        std::vector<int64_t> next(static_cast<size_t>(n));
        for (int64_t b = 0; b < n; b++) next[b] = std::max<int64_t>(sampled[j][b].token, 0);
        ids = at::tensor(next, kLongOpts).to(dev);
      }
    }
    if (j + 1 < k) pos = pos + 1;
    lap(times_.sample);
  }
  device.end();
  if (onDevice) {
    // The call's one deliberate sync: the host needs the tokens (stop checks, the response).
    const at::Tensor all = at::stack(results).cpu();
    for (int64_t j = 0; j < k; j++) {
      TensorSampled ts = readSampled(all[j], rows, setup.topK);
      sampled[j] = std::move(ts.sampled);
      for (int64_t b = 0; b < n; b++) {
        outs[j][b].topIds = std::move(ts.topIds[b]);
        outs[j][b].topLogprobs = std::move(ts.topLogprobs[b]);
      }
    }
  }
  times_.device += device.seconds();
  lap(times_.sample);
  std::vector<StepToken> out;
  std::vector<char> ended(static_cast<size_t>(n), 0);
  for (int64_t j = 0; j < k; j++)
    for (int64_t b = 0; b < n; b++) {
      if (ended[b]) continue;  // stopped at an earlier step of this call: the rest is dropped
      Sequence& s = *p.decode[b];
      s.computed++;
      if (s.req.returnRoutes) outs[j][b].routes = routesOf(routing[j], *model, b, 1);
      applyToken(s, sampled[j][b], outs[j][b]);
      ended[b] = outs[j][b].finished;
      out.push_back(std::move(outs[j][b]));
    }
  for (Sequence* s : p.decode) indexComputed(*s);
  retire(out);
  lap(times_.finish);
  return out;
}

void Generator::sampleLogits(const std::vector<Sequence*>& seqs, const at::Tensor& logits,
                             std::vector<Sampled>& sampled, std::vector<StepToken>& out) {
  const int64_t n = int64_t(seqs.size());
  if (!logits.is_cpu() || tensorSampler) {
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
  // On the host, per row: the first maximum (a comparison pass), e = exp((x - max) / T)
  // vectorised for the batch (T = 1 for greedy rows), then the sampler's sum and inverse-CDF scan
  // over e. No log-softmax or probability tensor of the batch's size, no sort unless top-p is on
  // (sampler.h).
  at::Tensor x0 = logits.contiguous();
  const int64_t V = x0.size(1);
  // Logit bias, min_tokens and penalties (sampler.h) change a row before anything reads it: a copy.
  if (std::any_of(seqs.begin(), seqs.end(), [](const Sequence* s) { return s->adjust.active(); })) {
    x0 = x0.clone();
    AT_DISPATCH_FLOATING_TYPES(x0.scalar_type(), "adjust", [&] {
      for (int64_t i = 0; i < n; i++) seqs[i]->adjust.apply(x0.data_ptr<scalar_t>() + i * V);
    });
  }
  std::vector<int64_t> best(static_cast<size_t>(n));
  std::vector<double> temps(static_cast<size_t>(n)), maxes(size_t(n), 0.0);
  for (int64_t b = 0; b < n; b++)
    temps[b] = seqs[b]->req.sampling.temperature > 0 ? seqs[b]->req.sampling.temperature : 1.0;
  AT_DISPATCH_FLOATING_TYPES(x0.scalar_type(), "sample", [&] {
    const scalar_t* x = x0.data_ptr<scalar_t>();
    hostParallelFor(n, rowsGrain(V), [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; i++)
        if ((best[i] = rowArgmax(x + i * V, V)) >= 0) maxes[i] = double(x[i * V + best[i]]);
    });
    const auto opts = at::TensorOptions().dtype(at::kDouble);
    at::Tensor e = at::sub(x0, at::tensor(maxes, opts).to(x0.scalar_type()).unsqueeze(1))
                       .div_(at::tensor(temps, opts).to(x0.scalar_type()).unsqueeze(1))
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
        Sequence& s = *seqs[i];
        const RowLogits<scalar_t> row{x + i * V, ex + i * V, V, best[i], temps[i]};
        double logNorm = 0;
        sampled[i] = sampleToken(row, s.req.sampling, s.rng, order, &logNorm);
        s.adjust.sampled(sampled[i].token);
        if (s.req.topLogprobs > 0) topLogprobs(row, logNorm, s.req.topLogprobs, out[i].topIds, out[i].topLogprobs);
      }
    });
  });
}

void Generator::applyToken(Sequence& s, const Sampled& sampled, StepToken& out) {
  out.seqId = s.id;
  if (!s.reported) {
    out.first = s.reported = true;
    if (s.req.promptLogprobs) {
      if (s.promptLogprobs.empty())
        s.promptLogprobs.assign(size_t(s.promptLen), std::numeric_limits<float>::quiet_NaN());
      out.promptLogprobs = std::move(s.promptLogprobs);
    }
    if (s.req.returnRoutes) out.promptRoutes = std::move(s.promptRoutes);
  }
  if (sampled.token < 0 || s.failed) {
    // Non-finite K/V or logits (broken weights): this sequence ends with an error; the others go on.
    out.token = -1;
    out.logprob = std::numeric_limits<float>::quiet_NaN();
    out.finished = true;
    out.finishReason = "error";
    out.error = "the model produced non-finite logits (NaN or Inf): the served weights are broken";
    out.routes.clear();
    s.failed = true;
    return;
  }
  s.tokens.push_back(sampled.token);
  s.generated++;
  const auto& stops = s.req.stopTokenIds;
  std::string reason;
  if (std::find(stops.begin(), stops.end(), sampled.token) != stops.end()) reason = "stop";
  else if (s.generated >= s.req.maxTokens || s.computed >= maxSequenceLength) reason = "length";
  out.token = sampled.token;
  out.logprob = sampled.logprob;
  out.finished = !reason.empty();
  out.finishReason = reason;
}

void Generator::retire(const std::vector<StepToken>& out) {
  for (const StepToken& t : out) {
    if (!t.finished) continue;
    auto it = std::find_if(running_.begin(), running_.end(), [&](const SeqPtr& s) { return s->id == t.seqId; });
    if (it == running_.end()) continue;
    SeqPtr s = std::move(*it);
    running_.erase(it);
    releaseBlocks(*s);
  }
}

}  // namespace prime
