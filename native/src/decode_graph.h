// CUDA graphs of the decode step. At small batch a decode step of a 0.6B model is a few hundred
// microseconds of work for the card, but some 1,700 kernels (about 60 per layer) that the host
// launches one by one, each through the dispatcher: the step is bound by the host (BENCHMARKS.md,
// GPU section). A graph records those launches once and replays them with one call.
//
// A graph fixes shapes and addresses, so there is one per (batch bucket, key bucket): the batch
// padded to the next power of two (capped at the generator's slots), the keys read per sequence
// to the next power of two (at least kMinKeys, capped at the cache length). The step's ids and
// positions are copied into one static device buffer the graphs read; padding rows decode token 0
// at position 0 of a free slot, whose position 0 its next sequence writes before reading. The
// weights (updated in place by update_weights) and the KV cache keep their addresses. Graphs share
// one memory pool: they replay one at a time, and each step's logits are consumed (sampled) before
// the next replay. A graph is captured on first use, after one eager warm-up of the same step on
// the capture stream (which writes the same K/V the replay then writes again).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model.h"

namespace prime {

constexpr int64_t kMinKeys = 64;

// Bucket of a size: the next power of two >= n, at least `least`, capped at cap.
int64_t decodeBucket(int64_t n, int64_t least, int64_t cap);

class DecodeGraphs {
 public:
  // Graphs of model's decode over cache, for batches of up to cache.slots sequences.
  DecodeGraphs(std::shared_ptr<Model> model, KVCache& cache);
  ~DecodeGraphs();
  // Why graphs cannot serve this model ("" when they can): a build without CUDA, a model not on
  // CUDA, or sparse (MoE) layers, whose grouped MLP reads the tokens per expert on the host.
  static std::string unsupported(const Model& model);
  // Model::decode for the n = ids.size() sequences in slots 0..n-1 (keys: max(pos) + 1 at least),
  // through the graph of its buckets. Returns logits [n, V], a view of the graph's output that the
  // next call overwrites.
  at::Tensor decode(const std::vector<int64_t>& ids, const std::vector<int64_t>& pos, int64_t keys);
  // Graphs captured so far.
  int64_t captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace prime
