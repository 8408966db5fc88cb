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

}  // namespace prime
