// Training on packed rows: loss, gradient accumulation, clipping, AdamW, LoRA, checkpoints.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist.h"
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
  // Router replay (MoE): per token, per sparse layer in order, the numExpertsPerTok experts it
  // was routed to at inference ([N, sparse layers, K] flattened; -1 = the router decides, e.g.
  // for a sample's last token, which inference never fed); empty = the router decides.
  std::vector<int64_t> routes;
};

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.01;
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

struct StepStats {
  LossMetrics metrics;
  double gradNorm = 0, lr = 0, seconds = 0, forwardBackwardSeconds = 0, optimizerSeconds = 0;
  double commSeconds = 0;  // data parallel: gradient all-reduce + parameter broadcast (incl. waiting for peers)
  int64_t tokens = 0;
  // MoE: the router's load-balancing loss (token-weighted mean over rows; added to the loss times
  // LossConfig::routerAuxLossCoef), and the (token, slot) pairs each expert of each sparse layer
  // received over the step: the largest count and the mean (tokens x K / experts). 0 for dense models.
  double routerAuxLoss = 0, expertLoadMax = 0, expertLoadMean = 0;
};

class Trainer {
 public:
  Trainer(std::shared_ptr<Model> model, TrainerConfig cfg);
  ~Trainer();

  // zero grads, forward+backward over every row (accumulating), clip to maxGradNorm (<= 0: no
  // clipping), one AdamW step at lr. gradNorm is the total norm before clipping.
  StepStats step(const std::vector<TrainRow>& rows, const LossConfig& loss, double lr, double maxGradNorm);
  // Loss and gradients of the trainable parameters (HF names; LoRA: PEFT adapter names) without
  // an optimizer step (gradient checks, debugging). Grads are cleared after.
  StepStats gradients(const std::vector<TrainRow>& rows, const LossConfig& loss,
                      std::vector<std::pair<std::string, at::Tensor>>& grads);
  // Model::scoreRow under the policy being trained (LoRA adapters applied, no dropout).
  void score(const std::vector<int64_t>& ids, const std::vector<int64_t>& pos, double temperature,
             std::vector<float>& logprobs, std::vector<float>& entropies) const;
  // The trained policy's weights by HF name, for inference: the model's own, or with LoRA the
  // merged W + (alpha / rank) B A of each targeted projection. Fresh tensors, detached.
  std::vector<std::pair<std::string, at::Tensor>> policyWeights() const;
  // LoRA adapters by PEFT name (base_model.model.<module>.lora_{A,B}.weight); empty without LoRA.
  std::vector<std::pair<std::string, at::Tensor>> adapters() const;
  // Atomic checkpoint in dir/trainer.ckpt: trainable weights (all, or the adapters), AdamW
  // state, step count, the trainer's RNG state.
  void save(const std::string& dir);
  void load(const std::string& dir);

  // Data parallel from now on (call before any step or load): a step's loss normaliser, metrics
  // and gradients are summed over `group` (gradients in buckets of `bucketBytes`), and AdamW is
  // ZeRO-1: this rank holds the state of, and steps, only the parameters it owns (assigned
  // greedily by size, the same on every rank); each owner then broadcasts its updated parameters.
  // save() gathers the whole optimizer state to rank 0, which alone writes (other ranks pass any
  // dir); load() reads the whole file on every rank and keeps this rank's shard.
  void setGroup(std::shared_ptr<DistGroup> group, int64_t bucketBytes);

  int64_t stepCount() const { return step_; }
  const std::shared_ptr<Model> model;

 private:
  StepStats forwardBackward(const std::vector<TrainRow>& rows, const LossConfig& loss);
  // AdamW over this rank's parameters (all of them without a group, or with `all`).
  std::unique_ptr<torch::optim::AdamW> makeOptimizer(bool all = false) const;
  void zeroGrads();
  // A row's routes as per-layer [N, K] tensors for MoeRouting::replay (checked against the model).
  std::vector<at::Tensor> replayRoutes(const TrainRow& row, size_t r) const;
  void syncGradients();        // data parallel: sums the gradients over the group
  void broadcastParameters();  // data parallel: each owner's updated parameters to every rank
  // The whole optimizer state on rank 0 (gathered from the owners; null on other ranks).
  std::unique_ptr<torch::optim::AdamW> gatherOptimizer();
  const TrainerConfig cfg_;
  std::unique_ptr<LoraAdapters> lora_;                         // set with LoRA
  std::unique_ptr<Model> reference_;                           // set with cfg.reference (full fine-tuning)
  std::vector<std::pair<std::string, at::Tensor>> trainable_;  // what AdamW updates, checkpoint order
  std::unique_ptr<torch::optim::AdamW> optim_;
  at::Generator rng_;
  int64_t step_ = 0;
  std::shared_ptr<DistGroup> group_;  // set when data parallel
  int64_t bucketBytes_ = 0;
  std::vector<int> owner_;  // ZeRO-1: the rank that steps trainable_[i]
};

}  // namespace prime
