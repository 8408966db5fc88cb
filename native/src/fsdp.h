// Full sharding (trainer.dist.sharding = "full"), PyTorch's FSDP on our model: every rank holds
// 1/N of each parameter, in one flat buffer per unit (the embedding, each decoder layer, the final
// norm, an untied LM head: the stages of StageHooks, model.h), and gets the rest only while a
// stage runs.
//
//   - A unit's parameters lie back to back in its flat buffer; rank r keeps elements
//     [r S, (r + 1) S) of it, S = ceil(numel / N), as master weights in the model's dtype (fp32).
//     ShardPlan is that layout, the one description of it: the trainer, sharded checkpoints
//     (lib/trainer/shards.ts, through the addon's shardRange and shardLayout) all read it.
//   - Forward: a stage's enter all-gathers its units into their buffers, in the dtype the forward
//     computes in (bf16 under mixed precision), the model's parameters being views of them; the
//     next stage's gather is issued then, so it runs behind this stage's compute. leave frees the
//     buffers' storage (the views stay: autograd's saved tensors keep pointing at them).
//   - Backward: an autograd node after each stage's outputs gathers its units again before the
//     stage's backward runs (and issues the previous stage's gather); one before its inputs, run
//     once the stage's backward is done, reduce-scatters their gradients onto the shards (in the
//     master dtype, summed over ranks and over the step's rows) and frees the buffers. What is left
//     at the end of a backward (the embedding's gradient, which its stage's input cannot hook) is
//     reduce-scattered by a callback of the autograd engine then.
//   - AdamW steps this rank's pieces of the parameters (views of the shards), a parameter's
//     piece having a gradient when the parameter had one on any rank, as one trainer over all rows.
//
// Collectives are asynchronous (DistWork): on Gloo they run on its thread while this one
// computes, on NCCL on its own CUDA stream. Every rank issues the same collectives in the same
// order: the trainer runs the same number of forward/backward passes on every rank
// (Trainer::forwardBackward).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dist.h"
#include "model.h"

namespace prime {

// How a model's parameters group into units and lie in each unit's flat buffer: the unit of a
// parameter is the first stage that reads it; its parameters lie back to back in namedParameters()
// order. The layout of sharded checkpoints (lib/trainer/shards.ts reads it through the addon).
struct ShardPlan {
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    size_t unit = 0;
    int64_t offset = 0, numel = 0;  // in the unit's flat buffer
  };
  struct Unit {
    std::string name;  // "embed", "layers.3", "norm", "head"
    int64_t stage = 0;
    std::vector<size_t> params;
    int64_t numel = 0;
  };
  std::vector<Param> params;  // namedParameters() order
  std::vector<Unit> units;    // forward order
  // stageUnits[stage + 1]: the units stage `stage` reads (StageHooks numbering, -1 .. layers + 1).
  std::vector<std::vector<size_t>> stageUnits;

  static ShardPlan of(const Model& model);
  // Elements of a unit of `numel` per rank of `worldSize`: ceil(numel / worldSize).
  static int64_t shardNumel(int64_t numel, int64_t worldSize) { return (numel + worldSize - 1) / worldSize; }
  // The elements [begin, end) of a unit of `numel` that rank `rank` of `worldSize` holds: [rank S,
  // (rank + 1) S) within the unit, S = shardNumel (its shard is [S], zeros past the unit's end).
  static std::pair<int64_t, int64_t> shardRange(int64_t numel, int64_t rank, int64_t worldSize) {
    const int64_t S = shardNumel(numel, worldSize);
    return {std::min(rank * S, numel), std::min((rank + 1) * S, numel)};
  }
  // The part of one parameter inside elements [begin, end) of its unit's flat buffer: elements
  // [paramOffset, paramOffset + numel) of the parameter, at `at` from `begin`.
  struct Span {
    size_t param;
    int64_t paramOffset, at, numel;
  };
  // Those parts of unit u's parameters, in order.
  std::vector<Span> spans(size_t unit, int64_t begin, int64_t end) const;
};

class ShardedModel final : public StageHooks, public std::enable_shared_from_this<ShardedModel> {
 public:
  // Takes over `model`'s parameters: keeps this rank's shard of each unit, frees the rest, and
  // hooks the model's forwards (model.stageHooks). trainable: the parameters record gradients,
  // reduce-scattered onto the shards (else frozen: a LoRA base, a KL reference).
  static std::shared_ptr<ShardedModel> install(Model& model, std::shared_ptr<DistGroup> group, bool trainable);

  std::vector<at::Tensor> enter(int64_t stage, std::vector<at::Tensor> inputs) override;
  std::vector<at::Tensor> leave(int64_t stage, std::vector<at::Tensor> outputs) override;

  const ShardPlan& plan() const { return plan_; }
  int64_t shardNumel(size_t unit) const { return units_[unit].shard.numel(); }
  // This rank's elements of the unit's flat buffer, [begin, end) (end <= the unit's numel).
  std::pair<int64_t, int64_t> range(size_t unit) const;
  at::Tensor& shard(size_t unit) { return units_[unit].shard; }
  // Elements [offset, offset + values.numel()) of the unit's flat buffer, where they fall in this
  // rank's shard (a model built without weights gets them so, unit by unit).
  void fill(size_t unit, int64_t offset, const at::Tensor& values);
  const at::Tensor& shardGrad(size_t unit) const { return units_[unit].grad; }

  // The part of one parameter this rank holds: a view of its unit's shard, elements
  // [paramOffset, paramOffset + numel) of the parameter, at shardOffset in the shard.
  struct Piece {
    size_t param, unit;
    int64_t shardOffset, paramOffset, numel;
    at::Tensor view;
  };
  const std::vector<Piece>& pieces() const { return pieces_; }

  // Trainable: before a step's passes, the shards' gradients to zero.
  void zeroGrad();
  // After a step's passes: waits for the last reduce-scatters, then (a collective) gives each
  // piece its gradient, a view of the shard's, when its parameter had one on any rank in this step
  // or an earlier one (libtorch 1.13's zero_grad keeps a gradient, zeroed, once it has one), else none.
  void finishGradients();
  // Off: reduce-scatters leave uncounted which parameters had gradients (an idle pass's zeros).
  void countGradients(bool on) { counting_ = on; }
  // The sum of squares of this rank's shard gradients (the global norm sums it over ranks).
  double gradSquareSum() const;
  // Whether parameter p has a gradient (finishGradients), and the AdamW steps it has taken.
  bool hasGrad(size_t p) const { return hasGrad_[p] != 0; }
  std::vector<int64_t>& steps() { return steps_; }
  // After an optimizer step: counts it for every parameter with a gradient.
  void stepped();

  // A collective: unit u's parameters (or their gradients), gathered whole in the master dtype.
  std::vector<std::pair<std::string, at::Tensor>> gather(size_t unit, bool gradients);
  // Waits for and frees every gathered buffer (after a forward that did not run every stage).
  void releaseAll();

  // Bytes this rank holds: shards (master weights), shard gradients, and the most gathered at once
  // since the last call (reset by it).
  int64_t shardBytes() const;
  int64_t gradBytes() const;
  int64_t takeGatheredPeakBytes();

  // Called by the autograd nodes around the stages (fsdp.cc).
  void beforeBackward(int64_t stage);
  void afterBackward(int64_t stage);

 private:
  ShardedModel(Model& model, std::shared_ptr<DistGroup> group, bool trainable);
  // A fused tensor of the model (q/k/v, gate/up) whose parts lie back to back in a unit: a view
  // of the unit's gathered buffer too, so forwards without gradients still take one matmul.
  struct Alias {
    at::Tensor* tensor;
    int64_t offset, numel;
    std::vector<int64_t> shape;
  };
  struct Unit {
    std::vector<Alias> aliases;
    at::Tensor full;   // [N S] gathered buffer (gather dtype); its storage is empty while released
    at::Tensor shard;  // [S] this rank's master weights
    at::Tensor grad;   // [S] this rank's part of the summed gradient (trainable)
    std::shared_ptr<DistWork> gathering;
    bool gathered = false, reduced = false;
    int holds = 0;  // stages running that read it, forward or backward
  };
  // The model's parameters of unit u (and its fused tensors) become views of `full`.
  void viewsOf(size_t u, const at::Tensor& full);
  void require(size_t u, at::ScalarType dtype);
  void prefetch(size_t u, at::ScalarType dtype);
  void hold(size_t u, at::ScalarType dtype);
  void unhold(size_t u);
  void release(size_t u);
  void reduceScatter(size_t u);
  void backwardDone();  // the engine's callback at the end of a backward
  const std::vector<size_t>& unitsOf(int64_t stage) const;

  Model& model_;
  std::shared_ptr<DistGroup> group_;
  const bool trainable_;
  ShardPlan plan_;
  std::vector<at::Tensor> vars_;  // the model's parameters, plan_.params order
  std::vector<Unit> units_;
  std::vector<Piece> pieces_;
  std::deque<std::shared_ptr<DistWork>> reducing_;
  std::vector<float> localHas_;   // per parameter: a gradient on this rank in this step
  std::vector<uint8_t> hasGrad_;  // per parameter: a gradient on some rank, now or before
  std::vector<int64_t> steps_;    // per parameter: optimizer steps taken
  bool inBackward_ = false, counting_ = true;
  int64_t gatheredBytes_ = 0, gatheredPeak_ = 0;
};

}  // namespace prime
