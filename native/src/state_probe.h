// A probe of the state-slot bookkeeping (test-only: GeneratorChecks::stateProbe), which runs the
// state-slot kind even for a model without state layers. Each slot holds, beside the model's state,
// a digest of the tokens its sequence has fed: [hash, count], the hash a polynomial of the tokens
// modulo a prime. The probe behaves as a recurrent layer does under the contract of linear_state.h:
// after each forward it updates the rows' slots on the device from the ids fed (a decode row from
// its slot, a prefill chunk from its slot or from zeros at position 0), writes the snapshots the
// forward was asked for, and slots are copied with the model's state. Before each forward it
// checks that every row's slot holds the digest of exactly the tokens before the row's first
// position: a slot handed out, copied, snapshotted or restored wrongly fails the step with the
// sequence and positions named, where the model's own state would only give other tokens.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "cache_kind.h"
#include "linear_state.h"

namespace prime {

class StateProbe {
 public:
  StateProbe(int64_t numSlots, const at::Device& device);

  void copySlot(int64_t from, int64_t to);
  void zeroSlot(int64_t slot);
  // Throws std::logic_error unless each row's slot (slots[r]) holds the digest of its sequence's
  // tokens before rows[r].from (a chunk at position 0 reads nothing: unchecked).
  void check(const std::vector<SequenceWrite>& rows, const std::vector<int64_t>& slots, int64_t decodeRows) const;
  // The forward's effect: `ids` (on the device) are the rows' tokens in row order; chunk rows
  // (those after the first decodeRows) write snapshots[r - decodeRows].
  void update(const at::Tensor& ids, const std::vector<SequenceWrite>& rows, const std::vector<int64_t>& slots,
              int64_t decodeRows, const std::vector<std::vector<StateSnapshot>>& snapshots);

 private:
  at::Tensor digest_;  // [numSlots + 1, 2] int64: hash, count
};

}  // namespace prime
