#include "block_pool.h"

#include <stdexcept>
#include <string>

namespace prime {

BlockPool::BlockPool(int64_t numBlocks, PrefixCache& cache)
    : cache_(cache), refs_(size_t(numBlocks), 0), poisoned_(size_t(numBlocks), 0) {
  if (numBlocks < 1) throw std::runtime_error("the KV cache needs at least one block");
  // Block 0 first out.
  for (int64_t b = numBlocks - 1; b >= 0; b--) free_.push_back(int32_t(b));
}

int32_t BlockPool::take() {
  int32_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    b = cache_.evict();
  }
  if (b < 0) throw std::runtime_error("KV cache: no free block (" + std::to_string(numBlocks()) + " in use)");
  refs_[b] = 1;
  return b;
}

void BlockPool::retain(int32_t b) {
  if (refs_[b]++ == 0) cache_.unpark(b);
}

bool BlockPool::release(int32_t b) {
  if (refs_[b] <= 0) throw std::logic_error("KV cache: block " + std::to_string(b) + " released twice");
  if (--refs_[b] > 0) return false;
  if (!poisoned_[b] && cache_.keepsFreed() && cache_.holdsComputed(b)) {
    cache_.park(b);
    return false;
  }
  cache_.forget(b);
  free_.push_back(b);
  const bool clear = poisoned_[b];
  poisoned_[b] = 0;
  return clear;
}

void BlockPool::poison(int32_t b) {
  poisoned_[b] = 1;
  cache_.forget(b);
}

void BlockPool::clearCache() {
  for (int32_t b : cache_.clear()) free_.push_back(b);
}

}  // namespace prime
