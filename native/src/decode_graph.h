// CUDA graphs of the decode step. At small batch a decode step of a 0.6B model is a few hundred
// microseconds of work for the card, but some 1,700 kernels (about 60 per layer) that the host
// launches one by one, each through the dispatcher: the step is bound by the host (docs/benchmarks/gpu.md,
// the H200 profile). A graph records those launches once and replays them with one call.
//
// A graph fixes shapes and addresses, so there is one per (batch bucket, key bucket): the batch
// padded to the next power of two (capped at the generator's sequences), the positions read per
// sequence to the next power of two (at least kMinKeys, capped at the longest sequence). Token
// ids, positions, block tables and (hybrid models) state slots are graph inputs: each call copies them (device to
// device) into static buffers the graphs read, so one graph serves every step of its buckets whatever the lengths,
// blocks and slots. The key bucket is the width of the gather of the libtorch attention path
// (Model::decodeAttentionBmm); with the paged decode kernel (paged_decode.h), which reads the
// tables in place, it only bounds the kernel's partitions. Padding rows decode token 0 at position 0 with the pad block
// as their whole table and the pad slot as their state: they write only those, which no real row reads. The weights
// (updated in place by update_weights) and the paged cache keep their addresses. Graphs share one memory pool: they
// replay one at a time, and each step's logits are consumed (sampled) before the next replay. A graph is captured on
// first use, after one eager warm-up of the same step on the capture stream (which writes the same K/V the replay then
// writes again).
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
  // Graphs of model's paged decode over cache (and the state slots `states`, null without), for
  // batches of up to maxRows sequences whose block tables are `width` blocks wide; decodeKernel:
  // attention through the paged decode kernel.
  DecodeGraphs(std::shared_ptr<Model> model, PagedKV& cache, LinearStates* states, int64_t maxRows, int64_t width,
               bool decodeKernel);
  ~DecodeGraphs();
  // Why graphs cannot serve this model ("" when they can): a build without CUDA, a model not on
  // CUDA, or sparse (MoE) layers, whose grouped MLP reads the tokens per expert on the host.
  static std::string unsupported(const Model& model);
  // The logits [n, V] of Model::forwardPaged over n decode rows: ids [n], pos [n], tables
  // [n, width] and, with states, slots [n] (long, on the model's device), keys >= max(pos) + 1,
  // through the graph of its buckets. A view of the graph's output that the next call overwrites.
  at::Tensor decode(const at::Tensor& ids, const at::Tensor& pos, const at::Tensor& tables, const at::Tensor& slots,
                    int64_t keys);
  // Graphs captured so far.
  int64_t captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace prime
