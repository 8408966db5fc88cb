#include "cache_manager.h"

#include "cuda_info.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace prime {

namespace {
int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool runsBefore(const Sequence* a, const Sequence* b) {
  return a->req.priority < b->req.priority || (a->req.priority == b->req.priority && a->arrival < b->arrival);
}

// The cache's share of a CUDA device: gpuMemoryUtilization of its memory, less what is in use
// once the weights are loaded and one forward of a full step's tokens has run (its activations
// stay reserved by the caching allocator), as vLLM's profile run measures it.
int64_t cacheBytesOnDevice(const Model& model, const GeneratorOptions& o) {
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
    throw OptionError("gpuMemoryUtilization",
                      std::to_string(o.gpuMemoryUtilization) + " leaves no room for the KV cache: " +
                          std::to_string(mem.used >> 20) + " of " + std::to_string(mem.total >> 20) +
                          " MiB are in use after loading the weights and a forward of maxBatchedTokens tokens");
  return budget;
}

int64_t poolBlocks(const Model& model, const GeneratorOptions& o) {
  if (o.kvCacheTokens > 0) return ceilDiv(o.kvCacheTokens, o.blockSize);
  if (o.gpuMemoryUtilization > 0) {
    const int64_t blocks = cacheBytesOnDevice(model, o) / KvBlocks::blockBytes(model, o.blockSize) -
                           2;  // the null and pad blocks come from it too
    if (blocks < 1) throw OptionError("gpuMemoryUtilization", "leaves room for no KV block");
    return blocks;
  }
  return ceilDiv(o.maxSequences * o.maxSequenceLength, o.blockSize);
}
}  // namespace

CacheManager::CacheManager(std::shared_ptr<Model> model, const GeneratorOptions& o, const GeneratorChecks& checks)
    : model_(std::move(model)), prefixes_(o.blockSize, o.prefixSharing) {
  if (o.stateSlots < 0) throw std::runtime_error("stateSlots must be >= 0 (0: the default)");
  const bool hasState = model_->hybrid() || checks.stateProbe;
  if (o.stateSlots > 0 && !hasState)
    throw std::runtime_error("stateSlots: " + model_->cfg.arch +
                             " has no state layers (only hybrid models have slots)");
  // The slots first: on CUDA the KV cache gets what the device has left after them.
  LinearStates states;
  if (hasState) {
    const int64_t slots =
        o.stateSlots > 0 ? o.stateSlots : o.maxSequences * (o.prefixSharing == PrefixSharing::kCache ? 2 : 1);
    states = model_->linearStates(slots);
  }
  kv_ = std::make_unique<KvBlocks>(*model_, poolBlocks(*model_, o), o.blockSize, prefixes_);
  if (hasState) {
    state_ = std::make_unique<StateSlots>(std::move(states), model_->device, prefixes_, kv_->pool(), epoch_,
                                          checks.stateProbe);
    kinds_.push_back(state_.get());
  }
  kinds_.push_back(kv_.get());
  weightsSeen_ = model_->weightsVersion();
}

void CacheManager::computeKeys(Sequence& s) const {
  s.cache.keys.clear();
  prefixes_.extendKeys(s.cache.keys, s.tokens, int64_t(s.tokens.size()) / blockSize(), epoch_);
}

PrefixMatch CacheManager::match(const Sequence& s) const {
  PrefixMatch m;
  if (s.needsPromptOutputs()) return m;  // its whole prompt is computed
  const int64_t n = int64_t(s.tokens.size()), B = blockSize(), full = int64_t(s.cache.keys.size());
  const std::vector<BlockHash>& keys = s.cache.keys;
  int64_t i = 0;  // full: the full blocks of its tokens, all keyed by computeKeys
  for (; i < full; i++) {
    const PrefixCache::Entry e = prefixes_.find(keys[i], PrefixCache::parentOf(keys, i, epoch_), &s.tokens[i * B]);
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
  const Sequence* L = m.leader ? holder(m.leader) : nullptr;
  if (m.leader && !L) {  // an owner that is not running (never expected): its blocks are not shared
    m.blocks.resize(size_t(m.computedTokens / B));
    m.sharedTokens = m.computedTokens;
  }
  // The partial last block too, from a leader holding the same tokens there and not past them.
  if (L && i == full && n % B != 0 && int64_t(L->tokens.size()) >= n && L->computed < n &&
      int64_t(L->cache.blocks.size()) > full &&
      std::equal(s.tokens.begin() + full * B, s.tokens.end(), L->tokens.begin() + full * B)) {
    m.blocks.push_back(L->cache.blocks[full]);
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
  m.leaderSeq = m.leader ? L : nullptr;
  for (const CacheKind* k : kinds_) k->limitMatch(s, m);
  return m;
}

bool CacheManager::admit(Sequence& s, bool othersRun) {
  computeKeys(s);
  const PrefixMatch m = match(s);
  for (const CacheKind* k : kinds_)
    if (!k->fits(s, m, othersRun)) return false;
  for (CacheKind* k : kinds_) k->admit(s, m);
  SequenceCache& c = s.cache;
  c.epoch = epoch_;
  s.computed = m.computedTokens;
  c.leader = m.leader;
  c.sharedLen = m.leader ? m.sharedTokens : 0;
  c.indexed = s.computed / blockSize();
  prefixHitTokens_ += m.sharedTokens;
  // Its other full blocks are indexed now, so sequences that come while it computes them wait
  // for them instead of computing them too.
  for (int64_t i = int64_t(m.blocks.size()); i < int64_t(c.keys.size()); i++)
    prefixes_.insert(c.keys[i], PrefixCache::parentOf(c.keys, i, epoch_), &s.tokens[i * blockSize()], c.blocks[i],
                     s.id);
  holders_.insert(std::upper_bound(holders_.begin(), holders_.end(), &s, runsBefore), &s);
  return true;
}

bool CacheManager::syncEpoch() {
  const uint64_t v = model_->weightsVersion();
  if (v == weightsSeen_) return false;
  weightsSeen_ = v;
  epoch_++;
  for (CacheKind* k : kinds_) k->newEpoch();
  return true;
}

bool CacheManager::reserve(std::vector<SequenceWrite> writes) {
  for (SequenceWrite& w : writes) w.inPlace = hasWaitingFollowers(w.seq->id);
  for (const CacheKind* k : kinds_)
    if (!k->writesFit(writes)) return false;
  for (CacheKind* k : kinds_) k->prepareWrites(writes);
  return true;
}

CacheManager::StepState CacheManager::beginForward(const std::vector<SequenceWrite>& rows, int64_t decodeRows) {
  if (!state_) return {};
  StepState st = state_->beforeForward(rows, decodeRows, holders_);
  if (state_->probe()) state_->probe()->check(rows, st.slotOf, decodeRows);
  return st;
}

void CacheManager::probeUpdate(const at::Tensor& ids, const std::vector<SequenceWrite>& rows, int64_t decodeRows,
                               const StepState& st) {
  if (state_ && state_->probe()) state_->probe()->update(ids, rows, st.slotOf, decodeRows, st.snapshots);
}

void CacheManager::endForward() {
  if (state_) state_->afterForward();
}

std::vector<CacheManager::Followed> CacheManager::resolveFollowers(const std::vector<SequenceWrite>& ran) {
  std::vector<Followed> out;
  for (Sequence* f : holders_) {
    if (!f->waiting()) continue;
    auto at =
        std::find_if(ran.begin(), ran.end(), [&](const SequenceWrite& w) { return w.seq->id == f->cache.leader; });
    if (at == ran.end() || at->seq->computed < f->cache.sharedLen) continue;
    // With all its tokens shared, its last token's row is the leader's, computed now; were it
    // not (never expected), it computes that position again itself.
    const int64_t shared = f->cache.sharedLen;
    const bool allShared = shared == int64_t(f->tokens.size()), rowHere = shared - 1 >= at->from;
    f->computed = std::max(f->computed, allShared && !rowHere ? shared - 1 : shared);
    if (at->seq->failed) f->failed = true;
    if (allShared && rowHere) out.push_back({f, &*at, shared - 1});
    f->cache.leader = f->cache.sharedLen = 0;
  }
  return out;
}

void CacheManager::indexComputed(Sequence& s) {
  SequenceCache& c = s.cache;
  if (c.epoch != epoch_ || s.failed) return;
  const int64_t B = blockSize(), full = s.computed / B;
  prefixes_.extendKeys(c.keys, s.tokens, full, epoch_);  // the blocks its sampled tokens filled
  for (int64_t i = c.indexed; i < std::min(full, int64_t(c.keys.size())); i++) {
    // Indexed at admission (then a no-op), or now: a block its sampled tokens filled, or one it
    // computed again.
    prefixes_.insert(c.keys[i], PrefixCache::parentOf(c.keys, i, epoch_), &s.tokens[i * B], c.blocks[i], s.id);
    prefixes_.markComputed(c.blocks[i]);
  }
  c.indexed = std::max(c.indexed, full);
}

void CacheManager::promoteFollowers(const Sequence& leaving) {
  // The follower sharing the most takes over computing the prefix; the others follow it (they
  // share no more than it does, so it computes all they wait for).
  Sequence* heir = nullptr;
  for (Sequence* f : holders_)
    if (f->cache.leader == leaving.id && (!heir || f->cache.sharedLen > heir->cache.sharedLen)) heir = f;
  if (!heir) {
    prefixes_.dropOwned(leaving.id);
    return;
  }
  heir->computed = std::max(heir->computed, std::min(leaving.computed, heir->cache.sharedLen));
  for (CacheKind* k : kinds_) k->inherit(*heir, leaving);
  heir->cache.leader = heir->cache.sharedLen = 0;
  prefixes_.reassign(leaving.id, heir->id);
  for (Sequence* f : holders_)
    if (f->cache.leader == leaving.id) f->cache.leader = heir->id;
}

void CacheManager::release(Sequence& s, bool finished) {
  auto at = std::find(holders_.begin(), holders_.end(), &s);
  if (at == holders_.end()) throw std::logic_error("cache: sequence " + std::to_string(s.id) + " holds nothing");
  promoteFollowers(s);
  for (CacheKind* k : kinds_) k->release(s, finished);
  holders_.erase(at);
}

bool CacheManager::hasWaitingFollowers(int64_t id) const {
  for (const Sequence* s : holders_)
    if (s->cache.leader == id) return true;
  return false;
}

Sequence* CacheManager::holder(int64_t id) const {
  for (Sequence* s : holders_)
    if (s->id == id) return s;
  return nullptr;
}

void CacheManager::addStats(GeneratorStats& st) const {
  for (const CacheKind* k : kinds_) k->addStats(st);
  for (const Sequence* s : holders_) st.cachedTokens += s->computed;
  st.prefixHitTokens = prefixHitTokens_;
}

}  // namespace prime
