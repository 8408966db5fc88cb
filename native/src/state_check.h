// A hybrid model's paged forward with state slots (linear_state.h) checked against its packed
// forward, the one transformers' fixtures pin: what a generator's cache manager will drive, run by
// hand on one sequence, before and independently of any generator.
//
//   1. The prompt is prefilled in chunks of `prefillChunk` positions into slot 0 (keys and values of
//      the full-attention blocks into a paged cache of `blockSize`), taking a snapshot of the state
//      after `snapshotAt` positions into slot 1. Its hidden states are compared with the packed
//      forward's.
//   2. Slot 1 is copied into slot 2 (a shared prefix) and the rest of the prompt prefilled from it:
//      the same hidden states again (a snapshot continues exactly as the sequence did).
//   3. From slot 0, `greedySteps` decode steps (the recurrent rule, one token each) take the argmax
//      token; the packed forward of prompt + those tokens is compared at every decoded position.
// Each part reports the largest absolute difference of final hidden states from the packed forward's.
#pragma once

#include <cstdint>
#include <vector>

#include "model.h"

namespace prime {

struct StatePathOptions {
  std::vector<int64_t> prompt;
  int64_t prefillChunk = 32, snapshotAt = 16, blockSize = 16, greedySteps = 8;
};

struct StatePathResult {
  double prefillDiff = 0, snapshotDiff = 0, decodeDiff = 0;
  std::vector<int64_t> greedy;
};

StatePathResult checkStatePath(const Model& model, const StatePathOptions& o);

}  // namespace prime
