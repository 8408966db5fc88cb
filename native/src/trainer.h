// Training on packed rows: loss, gradient accumulation, clipping, AdamW, LoRA, checkpoints.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist.h"
#include "fsdp.h"
#include "loss.h"
#include "model.h"

namespace torch::optim {
class AdamW;
}

namespace prime {

// One packed row: samples back to back, positions restarting at 0 per sample. Per-token arrays
// are aligned with the tokens: lossMask[t] says whether token t is trained on (predicted from
// tokens before it in the same sample); advantages[t] and inferenceLogprobs[t] (the behaviour
// policy's logprob of token t) are what the policy losses need (empty for ce).
struct TrainRow {
  std::vector<int64_t> ids, pos;
  std::vector<uint8_t> lossMask;
  std::vector<double> advantages, inferenceLogprobs;
  // Cross-entropy weight of each token (echo's observation tokens, an sft-distilled teacher's
  // tokens), trained by the ce component beside the policy loss (loss.h); empty = none.
  std::vector<double> ceWeights;
  // Router replay (MoE): per token, per sparse layer in order, the numExpertsPerTok experts it
  // was routed to at inference ([N, sparse layers, K] flattened; -1 = the router decides, e.g.
  // for a sample's last token, which inference never fed); empty = the router decides.
  std::vector<int64_t> routes;
};

// Engine facts that cross N-API are declared once, as X-macro lists (facts.h): the struct, its
// reader or writer (addon/) and the TS interface (native/engine-types.generated.ts) all expand the
// same list.

// AdamW's hyperparameters (TrainerOptions in TS): X(name, default, doc).
#define PRIME_ADAMW_FIELDS(X)                                               \
  X(beta1, 0.9, "Decay of the running mean of the gradients.")              \
  X(beta2, 0.999, "Decay of the running mean of the squared gradients.")    \
  X(eps, 1e-8, "Added to the denominator (the root of the second moment).") \
  X(weightDecay, 0.01, "Decoupled weight decay: each step shrinks the weights by lr x this.")

struct AdamWConfig {
#define PRIME_ADAMW_FIELD(name, dflt, doc) double name = dflt;
  PRIME_ADAMW_FIELDS(PRIME_ADAMW_FIELD)
#undef PRIME_ADAMW_FIELD
};

struct LoraConfig {
  int64_t rank = 0;  // 0 = full fine-tuning
  double alpha = 0, dropout = 0;
  std::vector<std::string> targets;  // q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj
};

struct TrainerConfig {
  AdamWConfig adamw;
  LoraConfig lora;
  // Keep a frozen copy of the weights as they are now, the reference of the KL term (full
  // fine-tuning; with LoRA the reference is always the base model, adapters off).
  bool reference = false;
  uint64_t seed = 0;  // the trainer's RNG: LoRA init and dropout masks (checkpointed)
  // bf16 mixed precision (autocast.h): matmuls and attention in this dtype, the fp32 parameters,
  // gradients and AdamW state as they are. None: everything in the model's dtype.
  std::optional<at::ScalarType> mixedPrecision;
  // Activation checkpointing of every N-th decoder layer (checkpoint.h); 0 = off. Dense models.
  int64_t activationCheckpointing = 0;
};

// A step's fixed fields besides its metrics (TrainStepStats in TS): X(name, doc).
#define PRIME_STEP_FIELDS(X)                                                                            \
  X(lr, "The learning rate the step used (0 for gradients()).")                                         \
  X(seconds, "Wall time of the call.")                                                                  \
  X(forwardBackwardSeconds, "Of which the forward and backward passes over every row.")                 \
  X(optimizerSeconds, "Of which the gradient sync, clipping and AdamW.")                                \
  X(commSeconds,                                                                                        \
    "Data parallel (0 otherwise): the time some collective of the step ran (gathers, reduce-scatters, " \
    "all-reduces, broadcasts; waiting for the other ranks included).")                                  \
  X(commExposedSeconds,                                                                                 \
    "Of which the part the step waited for; the rest ran behind compute (full sharding's prefetched "   \
    "gathers and reduce-scatters).")

struct StepStats {
  // What the step measured, by the names a run records (lossMetrics, then the trainer's own:
  // tokens, grad_norm, tokens_per_s; MoE models: router_aux_loss, expert_load_max, expert_load_mean).
  Metrics metrics;
#define PRIME_STEP_FIELD(name, doc) double name = 0;
  PRIME_STEP_FIELDS(PRIME_STEP_FIELD)
#undef PRIME_STEP_FIELD
  int64_t tokens = 0;  // this step's (every rank's), for the metrics
};

// What data-parallel ranks shard (trainer.dist.sharding): kOptimizer = AdamW's state (ZeRO-1),
// every rank holding the whole model and its gradients; kFull = parameters, gradients and AdamW
// state alike (fsdp.h).
#define PRIME_SHARDINGS(X) X(kOptimizer, "optimizer") X(kFull, "full")
PRIME_ENUM(Sharding, PRIME_SHARDINGS, "SHARDINGS")

// The bytes a trainer holds, from its own tensors: parameters (master weights, or this rank's
// shards; a KL reference's too), gradients, AdamW state, and the most gathered parameter buffers
// at once since the last call (full sharding).
struct MemoryStats {
  int64_t parameterBytes = 0, gradientBytes = 0, optimizerBytes = 0, gatheredPeakBytes = 0;
};

class Trainer {
 public:
  Trainer(std::shared_ptr<Model> model, TrainerConfig cfg);
  ~Trainer();

  // zero grads, forward+backward over every row (accumulating), clip to maxGradNorm (<= 0: no
  // clipping), one AdamW step at lr. Its grad_norm metric is the total norm before clipping.
  StepStats step(const std::vector<TrainRow>& rows, const LossConfig& loss, double lr, double maxGradNorm);
  // Loss and gradients of the trainable parameters (HF names; LoRA: PEFT adapter names) without
  // an optimizer step (gradient checks, debugging). Grads are cleared after.
  StepStats gradients(const std::vector<TrainRow>& rows, const LossConfig& loss,
                      std::vector<std::pair<std::string, at::Tensor>>& grads);
  // Model::scoreRow under the policy being trained (LoRA adapters applied, no dropout).
  void score(const std::vector<int64_t>& ids, const std::vector<int64_t>& pos, double temperature,
             std::vector<float>& logprobs, std::vector<float>& entropies) const;
  // The trained policy's weights by HF name, for inference: the model's own, or with LoRA the
  // merged W + (alpha / rank) B A of each targeted projection. Fresh tensors, detached. Full
  // sharding: every unit gathered, the whole model at once (weightUnit streams it unit by unit).
  std::vector<std::pair<std::string, at::Tensor>> policyWeights();
  // The same, one unit at a time (ShardPlan: the embedding, each layer, the final norm, the head):
  // full sharding gathers it (a collective: every rank calls it, in the same order).
  size_t weightUnits() const { return plan_.units.size(); }
  std::vector<std::pair<std::string, at::Tensor>> weightUnit(size_t unit);
  // LoRA adapters by PEFT name (base_model.model.<module>.lora_{A,B}.weight); empty without LoRA.
  std::vector<std::pair<std::string, at::Tensor>> adapters() const;
  // Atomic checkpoint in dir/trainer.ckpt: trainable weights (all, or the adapters), AdamW
  // state, step count, the trainer's RNG state.
  void save(const std::string& dir);
  void load(const std::string& dir);
  // AdamW afresh (every moment at zero, its step count at 0), the weights as they are: a resume
  // that skips the checkpoint's optimizer state (ckpt.skip_optimizer).
  void resetOptimizer();

  // Data parallel from now on (call before any step or load): a step's loss normaliser, metrics
  // and gradients are summed over `group`.
  //  - kOptimizer (ZeRO-1): gradients all-reduced in buckets of `bucketBytes`; this rank holds the
  //    AdamW state of, and steps, only the parameters it owns (assigned greedily by size, the same
  //    on every rank); each owner then broadcasts its updated parameters. save() gathers the whole
  //    optimizer state to rank 0, which alone writes (other ranks pass any dir); load() reads the
  //    whole file on every rank and keeps this rank's shard.
  //  - kFull: the model's parameters are sharded (fsdp.h; LoRA: the frozen base, the adapters
  //    staying ZeRO-1 as above), every step runs the same number of forward/backward passes on
  //    every rank. Full fine-tuning checkpoints are sharded: each rank writes readShard's units
  //    (lib/trainer/shards.ts), then save() (a collective) writes the rest on rank 0.
  void setGroup(std::shared_ptr<DistGroup> group, int64_t bucketBytes, Sharding sharding = Sharding::kOptimizer);

  // Sharded checkpoints (lib/trainer/shards.ts). The units of the model's parameters and their
  // flat layout; whether this trainer's full fine-tuning is sharded, at what world size and rank
  // (else it reads and holds whole units: world size 1, rank 0), and the elements of unit u it
  // holds (ShardPlan::shardRange).
  const ShardPlan& shardPlan() const { return plan_; }
  bool shardsParameters() const { return sharded_ && !lora_; }
  int64_t shardWorldSize() const { return shardsParameters() ? group_->size() : 1; }
  int64_t shardRank() const { return shardsParameters() ? group_->rank() : 0; }
  std::pair<int64_t, int64_t> heldRange(size_t unit) const {
    return ShardPlan::shardRange(plan_.units.at(unit).numel, shardRank(), shardWorldSize());
  }
  // This rank's shard of unit u ([S] each, padded with zeros): master weights, Adam's first and
  // second moments (zeros where a parameter has no state yet). Sharded trainers only.
  std::array<at::Tensor, 3> readShard(size_t unit);
  // Unit u's weights and moments over this trainer's range of it, for the next load(): a sharded
  // checkpoint's trainer.ckpt then supplies the rest (steps, RNG).
  void stageShard(size_t unit, at::Tensor param, at::Tensor expAvg, at::Tensor expAvgSq);

  // A model built without weights (Model::withoutWeights), fully sharded: elements [offset,
  // offset + values.numel()) of unit u of the base weights (any float dtype), for this rank's
  // shards (the KL reference's too). Every element of this rank's range must come once.
  void loadBaseShard(size_t unit, int64_t offset, const at::Tensor& values);

  MemoryStats memory();
  int64_t stepCount() const { return step_; }
  const std::shared_ptr<Model> model;

 private:
  StepStats forwardBackward(const std::vector<TrainRow>& rows, const LossConfig& loss);
  // AdamW over this rank's parameters (all of them without a group, or with `all` all the
  // replicated ones), or over `params`.
  std::unique_ptr<torch::optim::AdamW> makeOptimizer(bool all = false) const;
  std::unique_ptr<torch::optim::AdamW> optimizerOver(const std::vector<at::Tensor>& params) const;
  void zeroGrads();
  // A row's routes as per-layer [N, K] tensors for MoeRouting::replay (checked against the model).
  std::vector<at::Tensor> replayRoutes(const TrainRow& row, size_t r) const;
  void syncGradients();        // data parallel: sums the replicated gradients over the group
  void broadcastParameters();  // data parallel: each owner's updated parameters to every rank
  // The whole optimizer state of the replicated parameters on rank 0 (gathered from the owners;
  // null on other ranks).
  std::unique_ptr<torch::optim::AdamW> gatherOptimizer();
  // Full sharding: a pass with no effect that issues the collectives of a real one (a rank with
  // fewer rows than another runs it in their place).
  void idlePass(const LossConfig& loss);
  // The global gradient norm: the replicated gradients', and the shards' summed over ranks.
  double globalGradNorm();
  // Copies the staged units (stageShard) into the parameters and a fresh optimizer's state.
  void applyStaged(const std::vector<int64_t>& steps, torch::optim::AdamW& into);
  // A plain checkpoint's parameters and optimizer state (whole, one per parameter) as staged units.
  void stageWhole(const std::vector<at::Tensor>& weights, torch::optim::AdamW& state);
  const TrainerConfig cfg_;
  std::unique_ptr<LoraAdapters> lora_;  // set with LoRA
  std::unique_ptr<Model> reference_;    // set with cfg.reference (full fine-tuning)
  // What AdamW updates whole, checkpoint order (ZeRO-1 owners with a group): the model's
  // parameters or the LoRA adapters; empty when the parameters are sharded (sharded_ has them).
  std::vector<std::pair<std::string, at::Tensor>> trainable_;
  ShardPlan plan_;                                            // the model's units
  std::shared_ptr<ShardedModel> sharded_, shardedReference_;  // full sharding
  std::unique_ptr<torch::optim::AdamW> optim_;
  at::Generator rng_;
  int64_t step_ = 0;
  std::shared_ptr<DistGroup> group_;  // set when data parallel
  int64_t bucketBytes_ = 0;
  std::vector<int> owner_;  // ZeRO-1: the rank that steps trainable_[i]
  // stageShard's units until load(): where they start in their unit, weights, moments.
  struct Staged {
    int64_t begin = 0;
    at::Tensor param, expAvg, expAvgSq;
  };
  std::map<size_t, Staged> staged_;
};

}  // namespace prime
