#include "prefix_cache.h"

#include <algorithm>

namespace prime {

namespace {
// splitmix64's finaliser: every input bit moves about half the output bits.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

BlockHash PrefixCache::root(uint64_t epoch) { return mix(epoch ^ 0x70726566697865ULL); }

BlockHash PrefixCache::hash(BlockHash parent, const int64_t* tokens) const {
  uint64_t h = mix(parent);
  for (int64_t i = 0; i < blockSize_; i++) h = mix(h ^ uint64_t(tokens[i]));
  return h;
}

void PrefixCache::extendKeys(std::vector<BlockHash>& keys, const std::vector<int64_t>& tokens, int64_t upTo,
                             uint64_t epoch) const {
  if (mode_ == PrefixSharing::kOff) return;
  for (int64_t i = int64_t(keys.size()); i < upTo; i++)
    keys.push_back(hash(parentOf(keys, i, epoch), &tokens[size_t(i * blockSize_)]));
}

PrefixCache::Entry PrefixCache::find(BlockHash key, BlockHash parent, const int64_t* tokens) const {
  auto it = byKey_.find(key);
  if (it == byKey_.end()) return {};
  const Stored& s = byBlock_.at(it->second);
  if (s.parent != parent || !std::equal(s.tokens.begin(), s.tokens.end(), tokens)) return {};
  return {it->second, s.computed, s.owner};
}

bool PrefixCache::insert(BlockHash key, BlockHash parent, const int64_t* tokens, int32_t block, int64_t owner) {
  if (mode_ == PrefixSharing::kOff || byKey_.count(key) || byBlock_.count(block)) return false;
  byKey_.emplace(key, block);
  byBlock_.emplace(block, Stored{key, parent, std::vector<int64_t>(tokens, tokens + blockSize_), false, owner});
  return true;
}

void PrefixCache::markComputed(int32_t block) {
  auto it = byBlock_.find(block);
  if (it == byBlock_.end()) return;
  it->second.computed = true;
  it->second.owner = 0;
}

void PrefixCache::reassign(int64_t from, int64_t to) {
  for (auto& [block, s] : byBlock_)
    if (!s.computed && s.owner == from) s.owner = to;
}

void PrefixCache::dropOwned(int64_t owner) {
  std::vector<int32_t> gone;
  for (const auto& [block, s] : byBlock_)
    if (!s.computed && s.owner == owner) gone.push_back(block);
  for (int32_t b : gone) forget(b);
}

void PrefixCache::forget(int32_t block) {
  auto it = byBlock_.find(block);
  if (it == byBlock_.end()) return;
  byKey_.erase(it->second.key);
  byBlock_.erase(it);
  unpark(block);
}

void PrefixCache::park(int32_t block) {
  if (lruPos_.count(block)) return;
  lruPos_[block] = lru_.insert(lru_.end(), block);
}

void PrefixCache::unpark(int32_t block) {
  auto it = lruPos_.find(block);
  if (it == lruPos_.end()) return;
  lru_.erase(it->second);
  lruPos_.erase(it);
}

int32_t PrefixCache::evict() {
  if (lru_.empty()) return -1;
  const int32_t b = lru_.front();
  forget(b);
  return b;
}

std::vector<int32_t> PrefixCache::clear() {
  std::vector<int32_t> freed(lru_.begin(), lru_.end());
  lru_.clear();
  lruPos_.clear();
  byKey_.clear();
  byBlock_.clear();
  return freed;
}

BlockHash PrefixCache::partialKey(BlockHash parent, const int64_t* tokens, int64_t tail) const {
  uint64_t h = mix(parent ^ 0x7061727469616cULL);  // "partial": never a full block's key
  for (int64_t i = 0; i < tail; i++) h = mix(h ^ uint64_t(tokens[i]));
  return mix(h ^ uint64_t(tail));
}

bool PrefixCache::insertPartial(BlockHash parent, const int64_t* tokens, int64_t tail, int32_t block) {
  const BlockHash key = partialKey(parent, tokens, tail);
  if (mode_ == PrefixSharing::kOff || byKey_.count(key) || byBlock_.count(block)) return false;
  byKey_.emplace(key, block);
  byBlock_.emplace(block, Stored{key, parent, std::vector<int64_t>(tokens, tokens + tail), true, 0});
  return true;
}

int32_t PrefixCache::findPartial(BlockHash parent, const int64_t* tokens, int64_t tail) const {
  const Entry e = find(partialKey(parent, tokens, tail), parent, tokens);
  return e.computed ? e.block : -1;
}

bool PrefixCache::putSnapshot(BlockHash parent, const int64_t* tokens, int64_t tail, int32_t slot) {
  if (!keepsSnapshots()) return false;
  const Snapshot same = findSnapshot(parent, tokens, tail);
  if (same.slot >= 0 && same.tail == tail) return false;
  snapLru_.push_back(slot);
  snapBySlot_.emplace(slot,
                      StoredSnapshot{parent, std::vector<int64_t>(tokens, tokens + tail), std::prev(snapLru_.end())});
  snapByParent_.emplace(parent, slot);
  return true;
}

PrefixCache::Snapshot PrefixCache::findSnapshot(BlockHash parent, const int64_t* tokens, int64_t available) const {
  Snapshot best;
  auto [from, to] = snapByParent_.equal_range(parent);
  for (auto it = from; it != to; ++it) {
    const StoredSnapshot& s = snapBySlot_.at(it->second);
    const int64_t tail = int64_t(s.tail.size());
    if (tail > available || (best.slot >= 0 && tail <= best.tail)) continue;
    if (std::equal(s.tail.begin(), s.tail.end(), tokens)) best = {it->second, tail};
  }
  return best;
}

void PrefixCache::touchSnapshot(int32_t slot) {
  auto it = snapBySlot_.find(slot);
  if (it == snapBySlot_.end()) return;
  snapLru_.splice(snapLru_.end(), snapLru_, it->second.lru);
}

void PrefixCache::dropSnapshot(int32_t slot) {
  auto it = snapBySlot_.find(slot);
  auto [from, to] = snapByParent_.equal_range(it->second.parent);
  for (auto p = from; p != to; ++p)
    if (p->second == slot) {
      snapByParent_.erase(p);
      break;
    }
  snapLru_.erase(it->second.lru);
  snapBySlot_.erase(it);
}

int32_t PrefixCache::evictSnapshot() {
  if (snapLru_.empty()) return -1;
  const int32_t slot = snapLru_.front();
  dropSnapshot(slot);
  return slot;
}

std::vector<int32_t> PrefixCache::clearSnapshots() {
  std::vector<int32_t> freed(snapLru_.begin(), snapLru_.end());
  snapLru_.clear();
  snapBySlot_.clear();
  snapByParent_.clear();
  return freed;
}

}  // namespace prime
