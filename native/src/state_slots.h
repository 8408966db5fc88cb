// Per-sequence state slots as a cache kind (cache_kind.h), for hybrid models: a Gated DeltaNet
// layer keeps a fixed-size state per sequence (linear_state.h), whatever its length, instead of
// K/V per position. Each running sequence holds one slot; the model's forward reads and writes it
// in place (a decode row steps it, a prefill chunk continues it, or starts from zeros at position
// 0). The state after position p summarises all of tokens[0, p), so it is shared by copying, never
// by reference, and a sequence can resume only where a state is at hand:
//   - a follower (the n completions of a request, a group's rollouts running together) gets its
//     leader's state at the end of their shared prefix: the leader's forward writes it into the
//     follower's slot (a snapshot of the chunk that passes that position), or its slot is copied
//     after a decode row ends there;
//   - with prefix sharing `cache`, the prefix cache (prefix_cache.h) keeps snapshots in slots of
//     their own: a sequence's state at the last block boundary before its prompt's last token
//     (what a later request with that prompt resumes from, computing the rest of the block), and
//     its final state when it finishes, with its partial last block (what its next turn, a
//     multi-turn continuation, resumes from: the slot moves to the cache, no copy). A sequence
//     resuming from a snapshot copies it (and that partial block) into its own;
//   - a preempted sequence frees its slot and is computed again (from a snapshot if one is kept).
// Snapshots are evicted least recently used first when a slot is needed; a weight update (a new
// policy epoch) drops them all. Admission needs a slot as it needs blocks.
//
// The interface with the model is linear_state.h (LinearStates, PagedBatch::slotOf and ::snapshots,
// Model::linearStates, forwardPaged's `states`), and these rules of it:
//   - snapshots inside a prefill chunk (the model writes the state after a position into another
//     slot), not chunks cut at the positions whose state is wanted: no extra steps, and the
//     scheduler knows nothing of state. The positions asked for are any in (chunkStart, chunkStart +
//     chunkLen], increasing, none twice (a follower's shared prefix may end inside a block, or with
//     the chunk); several followers at one position get copies of one snapshot after the forward.
//   - a chunk that starts at position 0 starts from zeros (the model's rule), and a decode row reads
//     its slot: a sequence whose first row is a decode row at position 0 (a 1-token prompt) gets a
//     zeroed slot here, so no other slot is ever cleared.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "block_pool.h"
#include "cache_kind.h"
#include "linear_state.h"
#include "prefix_cache.h"
#include "state_probe.h"

namespace prime {

class StateSlots : public CacheKind {
 public:
  // The slots of `states` (Model::linearStates; with `probe`, the probe's beside them, on
  // `device`), kept in `prefixes` under the cache manager's policy epoch `epoch`; `blocks` says who
  // holds a partial block.
  StateSlots(LinearStates states, const at::Device& device, PrefixCache& prefixes, const BlockPool& blocks,
             const uint64_t& epoch, bool probe);

  LinearStates& states() { return states_; }
  StateProbe* probe() { return probe_.get(); }
  int64_t numSlots() const { return states_.numSlots; }

  void limitMatch(const Sequence& s, PrefixMatch& m) const override;
  bool fits(const Sequence& s, const PrefixMatch& m, bool othersRun) const override;
  void admit(Sequence& s, const PrefixMatch& m) override;
  bool writesFit(const std::vector<SequenceWrite>&) const override { return true; }  // a slot never grows
  void prepareWrites(const std::vector<SequenceWrite>&) override {}
  void inherit(Sequence& heir, const Sequence& leaving) override;
  void release(Sequence& s, bool finished) override;
  void newEpoch() override;
  void addStats(GeneratorStats& st) const override;

  // The state side of one forward over `rows` (the first decodeRows of them decode rows): each
  // row's slot, and per prefill chunk the snapshots it writes, in position order: the states its
  // waiting followers (among `holders`) need, and its prompt's snapshot for the prefix cache.
  struct StepState {
    std::vector<int64_t> slotOf;
    std::vector<std::vector<StateSnapshot>> snapshots;
  };
  StepState beforeForward(const std::vector<SequenceWrite>& rows, int64_t decodeRows,
                          const std::vector<Sequence*>& holders);
  // After that forward: followers of decode rows get their leader's slot copied, the prompts'
  // snapshots go to the prefix cache.
  void afterForward();

  // Test-only views (native/testing.ts): free slots, and the slots of kept snapshots, least
  // recently used first.
  int64_t freeSlots() const { return int64_t(free_.size()); }

 private:
  // A free slot, else the least recently used snapshot's; -1 when neither is left.
  int32_t takeSlot();
  void freeSlot(int32_t slot) { free_.push_back(slot); }
  void copySlot(int32_t from, int32_t to);
  void zeroSlot(int32_t slot);
  // Keeps s's final state (its slot) as a snapshot, with its partial last block; false when it
  // cannot (the caller frees the slot).
  bool keepFinal(const Sequence& s, int32_t slot);

  PrefixCache& prefixes_;
  const BlockPool& blocks_;
  const uint64_t& epoch_;
  LinearStates states_;
  std::unique_ptr<StateProbe> probe_;
  std::vector<int32_t> free_;  // a stack
  // Between beforeForward and afterForward: slot copies to make, and prompt snapshots written.
  struct PendingSnapshot {
    const Sequence* seq;
    int64_t position;
    int32_t slot;
  };
  std::vector<std::pair<int32_t, int32_t>> pendingCopies_;
  std::vector<PendingSnapshot> pendingSnapshots_;
};

}  // namespace prime
