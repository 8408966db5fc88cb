// The generator's sequences and blocks: construction (the pool's size), admission with prefix
// sharing, preemption and resumption, removal, stats. The steps themselves: generator_step.cc.
#include "generator.h"

#include "cuda_info.h"
#include "paged_decode.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace prime {

namespace {
int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The KV cache's share of a CUDA device: gpuMemoryUtilization of its memory, less what is in use
// once the weights are loaded and one forward of a full step's tokens has run (its activations
// stay reserved by the caching allocator), as vLLM's profile run measures it.
int64_t kvBytesOnDevice(const Model& model, const GeneratorOptions& o) {
  const int64_t N = o.maxBatchedTokens;
  std::vector<int64_t> pos(static_cast<size_t>(N)), starts;
  for (int64_t t = 0; t < N; t++) {
    pos[t] = t % o.maxSequenceLength;
    if (pos[t] == 0) starts.push_back(t);
  }
  const auto longOpts = at::TensorOptions().dtype(at::kLong);
  {
    const at::Tensor hidden = model.forwardPacked(at::zeros({N}, longOpts).to(model.device),
                                                  at::tensor(pos, longOpts).to(model.device), starts);
    model.logits(hidden.narrow(0, 0, std::min(N, o.maxSequences)));
  }
  const CudaMemory mem = cudaMemory(model.device);  // synchronises the device
  const int64_t budget = int64_t(double(mem.total) * o.gpuMemoryUtilization) - mem.used;
  if (budget <= 0)
    throw std::runtime_error("gpuMemoryUtilization: " + std::to_string(o.gpuMemoryUtilization) +
                             " leaves no room for the KV cache: " + std::to_string(mem.used >> 20) + " of " +
                             std::to_string(mem.total >> 20) +
                             " MiB are in use after loading the weights and a forward of maxBatchedTokens tokens");
  return budget;
}
}  // namespace

Generator::Generator(std::shared_ptr<Model> m, const GeneratorOptions& o)
    : maxSequences(o.maxSequences), maxSequenceLength(o.maxSequenceLength), blockSize(o.blockSize),
      maxBatchedTokens(o.maxBatchedTokens), prefixSharing(o.prefixSharing), tensorSampler(o.tensorSampler),
      pagedAttentionKernel(o.pagedAttentionKernel), model(std::move(m)) {
  if (maxSequences <= 0 || maxSequenceLength <= 1)
    throw std::runtime_error("generator needs maxSequences >= 1 and maxSequenceLength >= 2");
  if (blockSize < 1 || blockSize > 1024) throw std::runtime_error("blockSize must be in [1, 1024]");
  if (maxBatchedTokens < maxSequences)
    throw std::runtime_error("maxBatchedTokens (" + std::to_string(maxBatchedTokens) +
                             ") must be at least maxSequences (" + std::to_string(maxSequences) +
                             "): every running sequence decodes in each step");
  if (o.kvCacheTokens < 0) throw std::runtime_error("kvCacheTokens must be >= 0 (0: unset)");
  if (!(o.gpuMemoryUtilization >= 0 && o.gpuMemoryUtilization <= 1))
    throw std::runtime_error("gpuMemoryUtilization must be in (0, 1] (0: unset)");
  if (o.gpuMemoryUtilization > 0 && !model->device.is_cuda())
    throw std::runtime_error("gpuMemoryUtilization: sizes the KV cache of a CUDA device; the model is on " +
                             model->device.str());
  const ArchConfig& c = model->cfg;
  if (pagedAttentionKernel) {
    // The most positions a decode step reads: the block tables' width in positions.
    const int64_t maxKeys = ceilDiv(maxSequenceLength, blockSize) * blockSize;
    const std::string why =
        pagedDecodeUnsupported(model->device, model->dtype, c.numHeads, c.numKvHeads, c.headDim, maxKeys);
    if (!why.empty()) throw std::runtime_error("pagedAttentionKernel: " + why);
  }
  int64_t blocks = 0;
  if (o.kvCacheTokens > 0) {
    blocks = ceilDiv(o.kvCacheTokens, blockSize);
  } else if (o.gpuMemoryUtilization > 0) {
    const int64_t bytesPerBlock =
        2 * c.numLayers * blockSize * c.numKvHeads * c.headDim * int64_t(at::elementSize(model->dtype));
    blocks = kvBytesOnDevice(*model, o) / bytesPerBlock - 2;  // the null and pad blocks come from it too
    if (blocks < 1) throw std::runtime_error("gpuMemoryUtilization: leaves room for no KV block");
  } else {
    blocks = ceilDiv(maxSequences * maxSequenceLength, blockSize);
  }
  prefixes_ = std::make_unique<PrefixCache>(
      blockSize, prefixSharing == PrefixSharing::kCache ? PrefixCache::Freed::kKeep : PrefixCache::Freed::kLiveOnly);
  pool_ = std::make_unique<BlockPool>(blocks, *prefixes_);
  cache_.numBlocks = blocks;
  cache_.blockSize = blockSize;
  for (int64_t l = 0; l < c.numLayers; l++) {
    // Zeroed: the null block must read as zeros, and masked positions still enter probs @ V as
    // 0 * v (uninitialised memory may be NaN).
    cache_.k.push_back(at::zeros({blocks + 2, blockSize, c.numKvHeads, c.headDim}, model->options()));
    cache_.v.push_back(at::zeros({blocks + 2, blockSize, c.numKvHeads, c.headDim}, model->options()));
  }
  weightsSeen_ = model->weightsVersion();
  eagerReason_ = o.cudaGraphs ? DecodeGraphs::unsupported(*model) : "CUDA graphs are off for this generator";
  if (eagerReason_.empty())
    graphs_ = std::make_unique<DecodeGraphs>(model, cache_, maxSequences, ceilDiv(maxSequenceLength, blockSize),
                                             pagedAttentionKernel);
  publishStats();
}

std::string Generator::eagerReason() const {
  std::lock_guard<std::mutex> lock(reasonMutex_);
  return eagerReason_;
}

void Generator::validate(const SequenceRequest& r) const {
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
  if (const std::string e = samplingError(r.sampling, model->cfg.vocabSize); !e.empty()) throw std::runtime_error(e);
  // The most positions it may hold: every token fed (all but the last sampled one), at most the
  // length limit. More than the pool could never run, even alone.
  const int64_t most = std::min<int64_t>(int64_t(r.prompt.size()) + r.maxTokens - 1, maxSequenceLength);
  if (most > capacityTokens())
    throw std::runtime_error("prompt + maxTokens need up to " + std::to_string(most) +
                             " KV positions; the cache holds " + std::to_string(capacityTokens()) + " (" +
                             std::to_string(numBlocks()) + " blocks of " + std::to_string(blockSize) + ")");
  model->checkTokenIds(r.prompt.data(), r.prompt.size());
}

std::vector<AddedSequence> Generator::add(const std::vector<SequenceRequest>& requests) {
  c10::InferenceMode inference;
  for (const SequenceRequest& r : requests) validate(r);
  syncEpoch();
  std::vector<AddedSequence> out;
  if (!preempted_.empty()) return out;  // they were admitted before: they resume first
  for (const SequenceRequest& r : requests) {
    auto s = std::make_unique<Sequence>();
    s->id = nextId_;
    s->req = r;
    s->tokens = r.prompt;
    s->promptLen = int64_t(r.prompt.size());
    s->arrival = nextArrival_;
    if (!admit(*s)) break;
    nextId_++;
    nextArrival_++;
    s->rng.seed(r.hasSeed ? r.seed : std::random_device{}());
    s->adjust = LogitAdjuster(r.sampling, r.stopTokenIds, model->cfg.vocabSize);
    out.push_back({s->id});
    insertRunning(std::move(s));
  }
  publishStats();
  return out;
}

void Generator::insertRunning(SeqPtr s) {
  auto at = std::upper_bound(running_.begin(), running_.end(), s, [](const SeqPtr& a, const SeqPtr& b) {
    return a->req.priority < b->req.priority || (a->req.priority == b->req.priority && a->arrival < b->arrival);
  });
  running_.insert(at, std::move(s));
}

void Generator::computeKeys(Sequence& s) const {
  s.keys.clear();
  if (prefixSharing == PrefixSharing::kOff) return;
  const int64_t full = int64_t(s.tokens.size()) / blockSize;
  BlockHash parent = PrefixCache::root(epoch_);
  for (int64_t i = 0; i < full; i++) s.keys.push_back(parent = prefixes_->hash(parent, &s.tokens[i * blockSize]));
}

Generator::Match Generator::matchPrefix(const Sequence& s) const {
  Match m;
  if (prefixSharing == PrefixSharing::kOff || s.needsPromptOutputs()) return m;
  const int64_t n = int64_t(s.tokens.size()), B = blockSize, full = int64_t(s.keys.size());
  int64_t i = 0;  // full: the full blocks of its tokens, all keyed by computeKeys
  for (; i < full; i++) {
    const BlockHash parent = i == 0 ? PrefixCache::root(epoch_) : s.keys[i - 1];
    const PrefixCache::Entry e = prefixes_->find(s.keys[i], parent, &s.tokens[i * B]);
    if (e.block < 0) break;
    if (e.computed) {
      if (m.leader) break;  // computed blocks come before a leader's (kept for safety)
      m.computedTokens += B;
    } else if (m.leader == 0 || e.owner == m.leader) {
      m.leader = e.owner;
    } else {
      break;  // another leader's: one is followed
    }
    m.blocks.push_back(e.block);
  }
  m.sharedTokens = int64_t(m.blocks.size()) * B;
  const Sequence* L = m.leader ? findRunning(m.leader) : nullptr;
  if (m.leader && !L) {  // an owner that is not running (never expected): its blocks are not shared
    m.blocks.resize(size_t(m.computedTokens / B));
    m.sharedTokens = m.computedTokens;
  }
  // The partial last block too, from a leader holding the same tokens there and not past them.
  if (L && i == full && n % B != 0 && int64_t(L->tokens.size()) >= n && L->computed < n &&
      int64_t(L->blocks.size()) > full &&
      std::equal(s.tokens.begin() + full * B, s.tokens.end(), L->tokens.begin() + full * B)) {
    m.blocks.push_back(L->blocks[full]);
    m.sharedTokens = n;
  }
  // All its tokens are shared, yet the last one's logits are needed: they come from the leader's
  // row for it when the leader has yet to compute it; with every block computed, that position is
  // computed again (a decode row, copying its block when others hold it); else (a leader already
  // past it) the last block is computed again.
  if (m.sharedTokens == n && !(L && L->computed <= n - 1)) {
    if (m.computedTokens == n) {
      m.computedTokens = n - 1;
      m.sharedTokens = n - 1;
    } else {
      m.blocks.pop_back();
      m.sharedTokens = int64_t(m.blocks.size()) * B;
      m.computedTokens = std::min(m.computedTokens, m.sharedTokens);
    }
  }
  if (m.sharedTokens == m.computedTokens) m.leader = 0;
  return m;
}

bool Generator::admit(Sequence& s) {
  if (int64_t(running_.size()) >= maxSequences) return false;
  computeKeys(s);
  const Match m = matchPrefix(s);
  const int64_t fresh = ceilDiv(int64_t(s.tokens.size()), blockSize) - int64_t(m.blocks.size());
  // Shared blocks parked in the prefix cache leave available() when taken up again.
  int64_t parked = 0;
  for (int32_t b : m.blocks) parked += pool_->refs(b) == 0;
  // While others run, a little room stays for their growth, so an admission is not undone by a
  // preemption at the next step (vLLM's watermark: 1% of the pool).
  const int64_t watermark = running_.empty() ? 0 : std::max<int64_t>(1, numBlocks() / 100);
  if (fresh + parked + watermark > pool_->available()) return false;
  for (int32_t b : m.blocks) pool_->retain(b);
  s.blocks = m.blocks;
  for (int64_t i = 0; i < fresh; i++) s.blocks.push_back(pool_->take());
  s.epoch = epoch_;
  s.computed = m.computedTokens;
  s.leader = m.leader;
  s.sharedLen = m.leader ? m.sharedTokens : 0;
  s.indexed = s.computed / blockSize;
  prefixHitTokens_ += m.sharedTokens;
  // Its other full blocks are indexed now, so sequences that come while it computes them wait
  // for them instead of computing them too.
  for (int64_t i = int64_t(m.blocks.size()); i < int64_t(s.keys.size()); i++) {
    const BlockHash parent = i == 0 ? PrefixCache::root(epoch_) : s.keys[i - 1];
    prefixes_->insert(s.keys[i], parent, &s.tokens[i * blockSize], s.blocks[i], s.id);
  }
  return true;
}

void Generator::indexComputed(Sequence& s) {
  if (prefixSharing == PrefixSharing::kOff || s.epoch != epoch_ || s.failed) return;
  const int64_t B = blockSize, full = s.computed / B;
  for (int64_t i = s.indexed; i < full; i++) {
    const BlockHash parent = i == 0 ? PrefixCache::root(epoch_) : s.keys[i - 1];
    if (i >= int64_t(s.keys.size())) s.keys.push_back(prefixes_->hash(parent, &s.tokens[i * B]));  // sampled tokens
    // Indexed at admission (then a no-op), or now: a block its sampled tokens filled, or one it
    // computed again.
    prefixes_->insert(s.keys[i], parent, &s.tokens[i * B], s.blocks[i], s.id);
    prefixes_->markComputed(s.blocks[i]);
  }
  s.indexed = std::max(s.indexed, full);
}

void Generator::syncEpoch() {
  const uint64_t v = model->weightsVersion();
  if (v == weightsSeen_) return;
  weightsSeen_ = v;
  epoch_++;
  pool_->clearCache();
  // Sequences that have not sampled since they were admitted would go on from K/V of the old
  // policy: they start over. Decoding ones keep theirs (a weight update lands between two tokens).
  for (size_t i = running_.size(); i-- > 0;) {
    const Sequence& s = *running_[i];
    if (s.leader != 0 || s.computed < int64_t(s.tokens.size()) - 1) preempt(i, /*counted=*/false);
  }
}

void Generator::resumePreempted() {
  while (!preempted_.empty()) {
    if (!admit(*preempted_.front())) break;
    insertRunning(std::move(preempted_.front()));
    preempted_.pop_front();
  }
}

void Generator::preempt(size_t index, bool counted) {
  SeqPtr s = std::move(running_[index]);
  running_.erase(running_.begin() + int64_t(index));
  releaseBlocks(*s);
  s->computed = 0;
  s->leader = s->sharedLen = 0;
  s->indexed = 0;
  if (!s->reported) {  // its prompt's outputs are computed again
    s->promptLogprobs.clear();
    s->promptRoutes.clear();
  }
  if (counted) preemptions_++;
  auto at = std::upper_bound(preempted_.begin(), preempted_.end(), s, [](const SeqPtr& a, const SeqPtr& b) {
    return a->req.priority < b->req.priority || (a->req.priority == b->req.priority && a->arrival < b->arrival);
  });
  preempted_.insert(at, std::move(s));
}

void Generator::promoteFollowers(const Sequence& leaving) {
  if (prefixSharing == PrefixSharing::kOff) return;
  // The follower sharing the most takes over computing the prefix; the others follow it (they
  // share no more than it does, so it computes all they wait for).
  Sequence* heir = nullptr;
  for (const SeqPtr& f : running_)
    if (f->leader == leaving.id && (!heir || f->sharedLen > heir->sharedLen)) heir = f.get();
  if (!heir) {
    prefixes_->dropOwned(leaving.id);
    return;
  }
  heir->computed = std::max(heir->computed, std::min(leaving.computed, heir->sharedLen));
  heir->leader = heir->sharedLen = 0;
  prefixes_->reassign(leaving.id, heir->id);
  for (const SeqPtr& f : running_)
    if (f->leader == leaving.id) f->leader = heir->id;
}

void Generator::releaseBlocks(Sequence& s) {
  promoteFollowers(s);
  if (s.failed)
    for (int32_t b : s.blocks) pool_->poison(b);
  for (int32_t b : s.blocks)
    if (pool_->release(b)) zeroBlock(b);
  s.blocks.clear();
}

void Generator::zeroBlock(int32_t b) {
  for (size_t l = 0; l < cache_.k.size(); l++) {
    cache_.k[l][b].zero_();
    cache_.v[l][b].zero_();
  }
}

std::vector<bool> Generator::remove(const std::vector<int64_t>& seqIds) {
  c10::InferenceMode inference;
  std::vector<bool> removed;
  for (int64_t id : seqIds) {
    auto it = std::find_if(running_.begin(), running_.end(), [&](const SeqPtr& s) { return s->id == id; });
    if (it != running_.end()) {
      SeqPtr s = std::move(*it);
      running_.erase(it);
      releaseBlocks(*s);
      removed.push_back(true);
      continue;
    }
    auto p = std::find_if(preempted_.begin(), preempted_.end(), [&](const SeqPtr& s) { return s->id == id; });
    removed.push_back(p != preempted_.end());
    if (p != preempted_.end()) preempted_.erase(p);
  }
  publishStats();
  return removed;
}

Generator::Sequence* Generator::findRunning(int64_t id) const {
  for (const SeqPtr& s : running_)
    if (s->id == id) return s.get();
  return nullptr;
}

bool Generator::hasWaitingFollowers(int64_t id) const {
  for (const SeqPtr& s : running_)
    if (s->leader == id) return true;
  return false;
}

void Generator::publishStats() {
  GeneratorStats st;
  st.running = int64_t(running_.size());
  st.preempted = int64_t(preempted_.size());
  for (const SeqPtr& s : running_) st.cachedTokens += s->computed;
  st.blocksInUse = pool_->inUse();
  st.blocksCached = prefixes_->parked();
  st.preemptions = preemptions_;
  st.prefillTokens = prefillTokens_;
  st.prefixHitTokens = prefixHitTokens_;
  st.times = times_;
  std::lock_guard<std::mutex> lock(statsMutex_);
  stats_ = st;
}

GeneratorStats Generator::stats() const {
  std::lock_guard<std::mutex> lock(statsMutex_);
  return stats_;
}

}  // namespace prime
