// The paged KV cache as a cache kind (cache_kind.h): the K/V tensors (PagedKV, model.h) and the
// pool of their blocks (block_pool.h). A sequence holds the blocks its positions fill, taken as it
// grows: shared leading blocks first (a prefix others computed, or are computing), then its own. A
// shared block is copied when a sequence writes into it (copy-on-write), except by a leader, which
// writes in place what its waiting followers wait for. A leaving sequence gives its blocks back tail
// first.
#pragma once

#include <cstdint>
#include <vector>

#include "block_pool.h"
#include "cache_kind.h"
#include "model.h"
#include "prefix_cache.h"

namespace prime {

class KvBlocks : public CacheKind {
 public:
  // numBlocks blocks of blockSize positions for model's layers; `prefixes` keeps freed computed
  // blocks (mode cache).
  KvBlocks(const Model& model, int64_t numBlocks, int64_t blockSize, PrefixCache& prefixes);

  PagedKV& paged() { return kv_; }
  const BlockPool& pool() const { return pool_; }
  int64_t numBlocks() const { return pool_.numBlocks(); }
  int64_t blockSize() const { return kv_.blockSize; }
  // The bytes of one block's K/V over all layers.
  static int64_t blockBytes(const Model& model, int64_t blockSize);

  bool fits(const Sequence& s, const PrefixMatch& m, bool othersRun) const override;
  void admit(Sequence& s, const PrefixMatch& m) override;
  bool writesFit(const std::vector<SequenceWrite>& writes) const override;
  void prepareWrites(const std::vector<SequenceWrite>& writes) override;
  void release(Sequence& s, bool finished) override;
  void newEpoch() override { pool_.clearCache(); }
  void addStats(GeneratorStats& st) const override;

  // The blocks a write needs that its sequence does not hold writable: new ones, and copies of
  // shared ones.
  int64_t blocksNeeded(const SequenceWrite& w) const;

 private:
  // Whether a write must copy block `block` first: others read it, and the writer is not a leader
  // writing in place what its waiting followers wait for.
  bool copiesOnWrite(const SequenceWrite& w, int32_t block) const { return !w.inPlace && pool_.refs(block) > 1; }
  void copyBlock(int32_t from, int32_t to);
  void zeroBlock(int32_t b);  // a poisoned block, freed: its non-finite K/V must not be read as 0 * NaN

  PrefixCache& prefixes_;
  BlockPool pool_;
  PagedKV kv_;
};

}  // namespace prime
