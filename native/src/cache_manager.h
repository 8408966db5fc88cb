// The generator's cache manager: what each sequence holds in the cache, across the kinds of cache
// the model needs (cache_kind.h: paged KV blocks, and state slots for hybrid models) and the
// prefix cache that lets sequences share
// what others computed (prefix_cache.h, which holds the sharing mode). It decides what a new
// sequence takes from others (a computed prefix, or one a leader is computing: the sequence then
// follows that leader until it has), admits it when every kind has room, prepares each step's
// writes, hands a leaving leader's prefix to the follower sharing most, indexes computed blocks,
// and starts a new policy epoch when the weights change. Which sequences run, and when one is
// preempted, is the scheduler's (batch_scheduler.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache_kind.h"
#include "kv_blocks.h"
#include "model.h"
#include "prefix_cache.h"
#include "sequence.h"
#include "state_slots.h"

namespace prime {

class CacheManager {
 public:
  // Sizes the pool and the state slots from the options (GeneratorOptions::kvCacheTokens,
  // stateSlots); the state-slot kind serves hybrid models (Model::hybrid), or any with the probe.
  CacheManager(std::shared_ptr<Model> model, const GeneratorOptions& options, const GeneratorChecks& checks = {});

  int64_t numBlocks() const { return kv_->numBlocks(); }
  int64_t blockSize() const { return kv_->blockSize(); }
  int64_t capacityTokens() const { return numBlocks() * blockSize(); }
  PagedKV& paged() { return kv_->paged(); }
  // The state slots a forward reads and writes; null without the state-slot kind.
  LinearStates* states() { return state_ ? &state_->states() : nullptr; }

  // Takes what s needs (its prompt's blocks, shared ones first) if every kind has room now
  // (othersRun: keep room for the running sequences' growth); false otherwise. On success s
  // resumes at s.computed, or follows a leader (s.cache.leader).
  bool admit(Sequence& s, bool othersRun);
  // Whether the weights changed since the last call: then a new policy epoch has begun (what is
  // kept for reuse is gone; sequences computed under the old one keep what they hold).
  bool syncEpoch();
  uint64_t epoch() const { return epoch_; }
  // Whether the writes of a step fit; if so, prepares them (blocks taken, shared ones copied).
  bool reserve(std::vector<SequenceWrite> writes);

  // The state side of a forward over `rows` (the first decodeRows of them decode rows), for
  // PagedBatch::slotOf and snapshots: empty without the state-slot kind. With the probe, checks
  // the rows' slots.
  using StepState = StateSlots::StepState;
  StepState beginForward(const std::vector<SequenceWrite>& rows, int64_t decodeRows);
  // With the probe: a forward's effect on it, `ids` being the rows' tokens on the device.
  void probeUpdate(const at::Tensor& ids, const std::vector<SequenceWrite>& rows, int64_t decodeRows,
                   const StepState& st);
  // After the forward(s) since beginForward: slot copies made, snapshots kept.
  void endForward();

  // After a forward that computed `ran` (their positions [from, to), s.computed advanced): the
  // followers whose leader has now computed their shared prefix stop waiting. Those whose whole
  // tokens were shared sample from their leader's row for their last position: listed, in order.
  struct Followed {
    Sequence* follower;
    const SequenceWrite* leaderRow;  // the entry of `ran` the sampled position is in
    int64_t position;                // of that position
  };
  std::vector<Followed> resolveFollowers(const std::vector<SequenceWrite>& ran);
  // Indexes s's full blocks up to s.computed as computed, once they are.
  void indexComputed(Sequence& s);
  // s gives back what it holds (finished: a completion, else a preemption or abort); the prefix it
  // was computing for followers passes to the one sharing most.
  void release(Sequence& s, bool finished);

  void addStats(GeneratorStats& st) const;
  int64_t prefixHitTokens() const { return prefixHitTokens_; }

  // Test-only views (native/testing.ts).
  const BlockPool& blockPool() const { return kv_->pool(); }
  const PrefixCache& prefixCache() const { return prefixes_; }
  const StateSlots* stateSlots() const { return state_.get(); }

 private:
  PrefixMatch match(const Sequence& s) const;
  void computeKeys(Sequence& s) const;  // the keys of its full blocks under the current epoch
  void promoteFollowers(const Sequence& leaving);
  bool hasWaitingFollowers(int64_t id) const;
  Sequence* holder(int64_t id) const;

  std::shared_ptr<Model> model_;
  PrefixCache prefixes_;
  std::unique_ptr<KvBlocks> kv_;
  std::unique_ptr<StateSlots> state_;  // null: a model without state layers
  // Every kind: state_ first (a finishing sequence's final state indexes its partial block
  // before the block is given back), then kv_.
  std::vector<CacheKind*> kinds_;
  // The sequences holding cache, by (priority, arrival): the scheduler's running ones.
  std::vector<Sequence*> holders_;
  uint64_t epoch_ = 0, weightsSeen_ = 0;
  int64_t prefixHitTokens_ = 0;
};

}  // namespace prime
