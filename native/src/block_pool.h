// The KV cache's blocks: a fixed pool of blocks of blockSize token positions each, handed to
// sequences for their block tables and shared between them by reference count. A block whose last
// reference goes is free again, unless the prefix cache keeps it (prefix_cache.h): then it stays
// evictable, reused by a later sequence with that prefix or taken back when no free block is left.
// Host bookkeeping only: the K/V tensors the indices point into are the generator's (PagedKV).
#pragma once

#include <cstdint>
#include <vector>

#include "prefix_cache.h"

namespace prime {

class BlockPool {
 public:
  BlockPool(int64_t numBlocks, PrefixCache& cache);

  int64_t numBlocks() const { return int64_t(refs_.size()); }
  // Blocks take() can hand out now: free ones and the prefix cache's parked ones.
  int64_t available() const { return int64_t(free_.size()) + cache_.parked(); }
  // Blocks some sequence references.
  int64_t inUse() const { return numBlocks() - available(); }
  int32_t refs(int32_t b) const { return refs_[b]; }

  // A block with one reference: a free one, else the least recently used parked one (which
  // leaves the index). Throws when none is left (callers check available() first).
  int32_t take();
  // One more reference (a shared prefix); a parked block is in use again.
  void retain(int32_t b);
  // One reference less. Returns true when the block became free and holds K/V nobody may read
  // again unzeroed (it was poisoned): the caller clears it.
  bool release(int32_t b);
  // The block holds non-finite K/V: it leaves the prefix index, and its release reports it.
  void poison(int32_t b);
  // A new policy epoch: the index is cleared and the parked blocks are free.
  void clearCache();

 private:
  PrefixCache& cache_;
  std::vector<int32_t> refs_;
  std::vector<char> poisoned_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block goes out first
};

}  // namespace prime
