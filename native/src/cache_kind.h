// The seam between the generator's cache manager (cache_manager.h) and the kinds of memory a
// sequence holds in the cache: paged KV blocks (kv_blocks.h) for every model, per-sequence state
// slots (state_slots.h) for hybrid ones. A kind is told what the manager decides (admission with
// what a sequence takes from others, the writes of each step, who leads a shared prefix, release,
// a new policy epoch) and keeps its own resources and device tensors; a new kind of cache is one
// more class behind this interface.
#pragma once

#include <cstdint>
#include <vector>

#include "generation.h"
#include "sequence.h"

namespace prime {

// What a new sequence takes from others' computation (CacheManager::match).
struct PrefixMatch {
  std::vector<int32_t> blocks;  // leading blocks others hold: computed ones, then a leader's
  // tokens[0, computedTokens) are computed in them; tokens[0, sharedTokens) will be once `leader`
  // (0: none) has computed them.
  int64_t computedTokens = 0, sharedTokens = 0;
  int64_t leader = 0;
  const Sequence* leaderSeq = nullptr;  // that leader
  // Hybrid models: resuming at computedTokens from the prefix cache's state snapshot in this slot
  // (-1: none), whose partial last block is `partialBlock` (-1: none; copied, not shared).
  int32_t snapshot = -1, partialBlock = -1;
};

// Positions [from, to) of a sequence that one step writes (a decode row or a prefill chunk).
struct SequenceWrite {
  Sequence* seq;
  int64_t from, to;
  bool inPlace = false;  // a leader with waiting followers: it writes shared blocks in place
};

class CacheKind {
 public:
  virtual ~CacheKind() = default;

  // Shortens a match to where this kind can resume the sequence (a kind that holds whole-prefix
  // state resumes only where that state is at hand).
  virtual void limitMatch(const Sequence& s, PrefixMatch& m) const {}
  // Whether s, resuming at m, fits now (othersRun: others run, whose growth needs room too); and
  // taking what it needs.
  virtual bool fits(const Sequence& s, const PrefixMatch& m, bool othersRun) const = 0;
  virtual void admit(Sequence& s, const PrefixMatch& m) = 0;
  // Whether a step's writes fit (else the scheduler preempts); and preparing them.
  virtual bool writesFit(const std::vector<SequenceWrite>& writes) const = 0;
  virtual void prepareWrites(const std::vector<SequenceWrite>& writes) = 0;
  // `heir` takes over computing the prefix `leaving` (its leader) was computing for followers.
  virtual void inherit(Sequence& heir, const Sequence& leaving) {}
  // s gives back what it holds; finished (a completion, not a preemption): its contents may be
  // kept for reuse.
  virtual void release(Sequence& s, bool finished) = 0;
  // A new policy epoch (a weight update): what is kept for reuse goes.
  virtual void newEpoch() = 0;
  virtual void addStats(GeneratorStats& st) const = 0;
};

}  // namespace prime
