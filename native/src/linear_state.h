// The per-sequence state of a hybrid model's Gated DeltaNet blocks (Qwen3.5), the model's half of
// the hybrid cache. Full-attention blocks keep their keys and values in the paged KV cache
// (PagedKV, model.h); a Gated DeltaNet block instead carries a fixed-size state per sequence,
// whatever its length:
//   - conv: the last K - 1 inputs of its causal depthwise convolution (K = convKernel), the
//     window the next token's convolution reads: [convDim, K - 1], convDim = 2 Hk dk + Hv dv;
//   - recurrent: the delta rule's matrix per value head: [Hv, dk, dv], in fp32 (the rule's
//     arithmetic is fp32 whatever the model's dtype, as transformers' and FLA's).
//
// Who does what:
//   - The cache manager (the generator's) owns a LinearStates of numSlots slots and hands one slot
//     to each running sequence, as it hands out KV blocks. It copies a slot to share a prefix's
//     state (the n completions of a request, a group's rollouts: copy, never recompute), keeps
//     snapshots (states at block boundaries) for its prefix cache in slots of their own, and drops
//     them when the weights change (Model::weightsVersion), as it does KV blocks.
//   - The model reads and writes the slots its forward is given: forwardPaged (model.h) takes the
//     slot of each table row (PagedBatch::slotOf). A decode row's step updates its slot in place; a
//     prefill chunk continues from its slot's state, or from zeros when it starts at position 0
//     (a fresh slot need not be cleared), and leaves its final state there. With
//     PagedBatch::snapshots it also writes the state after given positions into given slots.
//   - Nothing here allocates per step: slot indices are device tensors (a CUDA graph of decode
//     rows reads them as inputs), and the pad slot takes padding rows' writes.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace prime {

// A Gated DeltaNet block's sizes (ArchConfig::linear).
struct LinearAttentionSizes {
  int64_t numKeyHeads = 0, numValueHeads = 0, keyHeadDim = 0, valueHeadDim = 0, convKernel = 0;
  bool defined() const { return numKeyHeads > 0; }
  int64_t keyDim() const { return numKeyHeads * keyHeadDim; }
  int64_t valueDim() const { return numValueHeads * valueHeadDim; }
  int64_t convDim() const { return 2 * keyDim() + valueDim(); }
};

// The state slots of every Gated DeltaNet block: per layer (undefined for full-attention blocks)
//   conv[l]      [numSlots + 1, convDim, K - 1]  in the model's compute dtype
//   recurrent[l] [numSlots + 1, Hv, dk, dv]      fp32 (fp64 for fp64 models)
// Slot numSlots is the pad slot: padding rows of a CUDA graph write it, nothing reads it.
struct LinearStates {
  std::vector<at::Tensor> conv, recurrent;
  int64_t numSlots = 0;
  int64_t padSlot() const { return numSlots; }
  // Bytes of one slot over all layers (for admission and /metrics).
  int64_t slotBytes() const;
  // Copies slot `from` into slot `to` in every layer (a shared prefix's state; a snapshot).
  void copySlot(int64_t from, int64_t to);
  // The same for many pairs at once, from[i] -> to[i] (long tensors on the states' device).
  void copySlots(const at::Tensor& from, const at::Tensor& to);
};

// A prefill chunk's snapshot: the state after its first `position` tokens of the sequence
// (position in (chunkStart, chunkStart + chunkLen], a block boundary as the prefix cache keeps
// them) is copied into slot `slot`. Per PagedBatch prefill segment, in position order.
struct StateSnapshot {
  int64_t position = 0;
  int64_t slot = 0;
};

}  // namespace prime
