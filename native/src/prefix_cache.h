// The index of the cache's contents by the tokens they hold, so sequences with a common prompt
// prefix share them instead of computing them again (vLLM's automatic prefix caching, SGLang's
// radix cache at block granularity). It holds the sharing mode (off, live, cache): with off it
// indexes and finds nothing, and no caller branches on the mode.
//
// KV blocks. A full block is keyed by a chain hash: its tokens and the key of the block before it,
// the first block's parent being the policy epoch, so a weight update (a new epoch) makes every
// earlier prefix unmatchable. Entries are verified token by token on lookup: a hash collision never
// shares a wrong block. A block is indexed from the moment a sequence is admitted with it (its
// owner computes it in the coming steps: another sequence with that prefix waits for it rather than
// computing it twice) and marked computed once its K/V are in. When its last reference goes, a
// computed block either stays indexed and parked in an LRU list (the cache of freed prefixes, mode
// cache) until a later sequence reuses it or the pool needs it back, or leaves the index (live:
// only sequences alive together share). A sequence gives its blocks back tail first (vLLM's rule),
// so of its prefix the block every reuse needs, the first, is evicted last.
//
// State snapshots (hybrid models, mode cache; state_slots.h). A snapshot is the state of a
// sequence's recurrent layers after position p, in a state slot of its own, keyed like a block:
// the key of the last full block before p (or the epoch's root) and the tokens of the partial
// block up to p (none at a block boundary). A snapshot off a block boundary comes with that
// partial block, indexed under a partial key (the same parent and tokens) as a computed block: a
// sequence resuming from the snapshot copies it. Snapshots have an LRU list of their own; a new
// epoch drops them with the blocks.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "generation.h"

namespace prime {

using BlockHash = uint64_t;

class PrefixCache {
 public:
  PrefixCache(int64_t blockSize, PrefixSharing mode) : blockSize_(blockSize), mode_(mode) {}

  PrefixSharing mode() const { return mode_; }
  int64_t blockSize() const { return blockSize_; }

  // The parent of a sequence's first block under policy epoch `epoch`.
  static BlockHash root(uint64_t epoch);
  // The key of a full block of blockSize tokens after the block keyed `parent`.
  BlockHash hash(BlockHash parent, const int64_t* tokens) const;
  // Appends to `keys` the keys of tokens' full blocks [keys.size(), upTo) under `epoch` (none
  // when sharing is off: nothing is indexed then).
  void extendKeys(std::vector<BlockHash>& keys, const std::vector<int64_t>& tokens, int64_t upTo, uint64_t epoch) const;
  // The parent key of full block i of a sequence with these keys.
  static BlockHash parentOf(const std::vector<BlockHash>& keys, int64_t i, uint64_t epoch) {
    return i == 0 ? root(epoch) : keys[size_t(i - 1)];
  }

  struct Entry {
    int32_t block = -1;
    bool computed = false;
    int64_t owner = 0;  // the sequence computing it (0 once computed)
  };
  // The block indexed under `key` holding exactly these tokens after `parent`; block -1 when none.
  Entry find(BlockHash key, BlockHash parent, const int64_t* tokens) const;
  // Indexes `block` under `key` (not computed yet: `owner` computes it). False, and nothing
  // indexed, when sharing is off, the key is taken or the block already indexed: the block is
  // then private.
  bool insert(BlockHash key, BlockHash parent, const int64_t* tokens, int32_t block, int64_t owner);
  // Whether the block is indexed with its K/V computed (what a freed block must be to be kept).
  bool holdsComputed(int32_t block) const {
    auto it = byBlock_.find(block);
    return it != byBlock_.end() && it->second.computed;
  }
  bool indexed(int32_t block) const { return byBlock_.count(block) > 0; }
  void markComputed(int32_t block);
  // The uncomputed blocks `from` owns pass to `to` (its first follower, when `from` leaves).
  void reassign(int64_t from, int64_t to);
  // Drops the uncomputed blocks `owner` indexed (it left with nobody to take them over).
  void dropOwned(int64_t owner);
  // Drops the block from the index (and from the LRU list).
  void forget(int32_t block);

  // The LRU list of indexed blocks nobody references (mode cache only).
  bool keepsFreed() const { return mode_ == PrefixSharing::kCache; }
  void park(int32_t block);    // its last reference went: most recently used end
  void unpark(int32_t block);  // referenced again
  int64_t parked() const { return int64_t(lru_.size()); }
  // The parked blocks, least recently used first (the order evict() takes them).
  std::vector<int32_t> parkedOrder() const { return std::vector<int32_t>(lru_.begin(), lru_.end()); }
  // Forgets the least recently used parked block and returns it; -1 when none is parked.
  int32_t evict();
  // Forgets every block entry (a new policy epoch); returns the parked blocks, now free.
  std::vector<int32_t> clear();

  // --- state snapshots (mode cache) ---
  bool keepsSnapshots() const { return mode_ == PrefixSharing::kCache; }
  // The key of the partial block of `tail` tokens (0 < tail < blockSize) after `parent`.
  BlockHash partialKey(BlockHash parent, const int64_t* tokens, int64_t tail) const;
  // Indexes a partial block as computed (a snapshot's; see above). False when not indexed.
  bool insertPartial(BlockHash parent, const int64_t* tokens, int64_t tail, int32_t block);
  // The computed partial block of these `tail` tokens after `parent`, or -1.
  int32_t findPartial(BlockHash parent, const int64_t* tokens, int64_t tail) const;
  // Keeps slot `slot` as the snapshot after `parent`'s block and these `tail` tokens. False, and
  // nothing kept, when such a snapshot is kept already (the caller frees the slot).
  bool putSnapshot(BlockHash parent, const int64_t* tokens, int64_t tail, int32_t slot);
  struct Snapshot {
    int32_t slot = -1;
    int64_t tail = 0;
  };
  // The snapshot after `parent`'s block whose tail tokens lead `tokens` (of which `available`
  // may be used), the longest such; slot -1 when none.
  Snapshot findSnapshot(BlockHash parent, const int64_t* tokens, int64_t available) const;
  void touchSnapshot(int32_t slot);  // used: most recently used end
  int64_t snapshots() const { return int64_t(snapLru_.size()); }
  std::vector<int32_t> snapshotOrder() const { return std::vector<int32_t>(snapLru_.begin(), snapLru_.end()); }
  // Drops the least recently used snapshot and returns its slot; -1 when none is kept.
  int32_t evictSnapshot();
  // Drops every snapshot (a new policy epoch); returns their slots, now free.
  std::vector<int32_t> clearSnapshots();

 private:
  struct Stored {
    BlockHash key, parent;
    std::vector<int64_t> tokens;  // blockSize of them, or a partial block's fewer
    bool computed;
    int64_t owner;
  };
  struct StoredSnapshot {
    BlockHash parent;
    std::vector<int64_t> tail;
    std::list<int32_t>::iterator lru;
  };
  void dropSnapshot(int32_t slot);

  const int64_t blockSize_;
  const PrefixSharing mode_;
  std::unordered_map<BlockHash, int32_t> byKey_;
  std::unordered_map<int32_t, Stored> byBlock_;
  std::list<int32_t> lru_;  // front: least recently used
  std::unordered_map<int32_t, std::list<int32_t>::iterator> lruPos_;
  std::unordered_multimap<BlockHash, int32_t> snapByParent_;  // parent -> slots
  std::unordered_map<int32_t, StoredSnapshot> snapBySlot_;
  std::list<int32_t> snapLru_;  // slots, front: least recently used
};

}  // namespace prime
