// One sequence of the generator as its parts share it: the scheduler queues it and advances it,
// the cache manager gives it its blocks and state slot (SequenceCache), the model runner feeds its
// tokens and samples for it.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "generation.h"
#include "prefix_cache.h"
#include "sampler.h"

namespace prime {

// What the cache manager holds for a sequence.
struct SequenceCache {
  std::vector<int32_t> blocks;  // its block table: the blocks of positions [0, blocks.size() * B)
  std::vector<BlockHash> keys;  // prefix-cache keys of the full blocks of its tokens, as far as known
  int64_t indexed = 0;          // leading blocks indexed as computed
  uint64_t epoch = 0;           // the policy epoch its K/V (and state) were computed under
  int32_t slot = -1;            // its state slot (hybrid models; state_slots.h), -1 without
  // A follower waits until its leader has computed tokens[0, sharedLen) into the blocks they
  // share (and, hybrid, the state there into its slot); with sharedLen = tokens.size() it then
  // samples from the leader's row for the last one.
  int64_t leader = 0, sharedLen = 0;
  // Its slot's state ran past `computed`: a call of several decode steps went on after its stop
  // token (those tokens are dropped). It ends there, and its final state is not kept.
  bool stateAhead = false;
};

struct Sequence {
  int64_t id;
  SequenceRequest req;
  std::vector<int64_t> tokens;  // the prompt, then the sampled tokens
  int64_t promptLen;
  // tokens[0, computed) are in the cache: their K/V in its blocks and, hybrid, the state after
  // them in its slot.
  int64_t computed = 0;
  int64_t generated = 0;
  std::mt19937_64 rng;
  LogitAdjuster adjust;  // logit bias, min_tokens, penalties: sampler state, like rng
  uint64_t arrival;
  SequenceCache cache;
  bool reported = false;  // its first token went out (with the prompt's logprobs and routes)
  std::vector<float> promptLogprobs;
  std::vector<int32_t> promptRoutes;
  bool failed = false;  // non-finite K/V or logits
  bool needsPromptOutputs() const { return !reported && (req.promptLogprobs || req.returnRoutes); }
  bool waiting() const { return cache.leader != 0; }  // a follower: runs once its leader computed its prefix
};
using SeqPtr = std::unique_ptr<Sequence>;

}  // namespace prime
