// Training on packed rows: loss, gradient accumulation, clipping, AdamW, checkpoints.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model.h"

namespace torch::optim {
class AdamW;
}

namespace prime {

// One packed row: samples back to back, positions restarting at 0 per sample. Per-token arrays
// are aligned with the tokens: lossMask[t] says whether token t is trained on (predicted from
// tokens before it in the same sample).
struct TrainRow {
  std::vector<int64_t> ids, pos;
  std::vector<uint8_t> lossMask;
};

struct LossConfig {
  std::string kind = "ce";  // masked cross-entropy; RL losses (GRPO/GSPO/CISPO) slot into tokenLoss()
  double temperature = 1.0;  // logits / T before log-softmax, to match inference logprobs
  double normalizer = 0;     // loss = sum over loss tokens / normalizer; 0 = number of loss tokens
};

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.01;
};

struct StepStats {
  double loss = 0, gradNorm = 0, seconds = 0;
  int64_t tokens = 0, lossTokens = 0;
};

class Trainer {
 public:
  Trainer(std::shared_ptr<Model> model, AdamWConfig cfg);
  ~Trainer();

  // zero grads, forward+backward over every row (accumulating), clip to maxGradNorm (<= 0: no
  // clipping), one AdamW step at lr. gradNorm is the total norm before clipping.
  StepStats step(const std::vector<TrainRow>& rows, const LossConfig& loss, double lr, double maxGradNorm);
  // Loss and gradients without an optimizer step (gradient checks, debugging). Grads are cleared after.
  StepStats gradients(const std::vector<TrainRow>& rows, const LossConfig& loss,
                      std::vector<std::pair<std::string, at::Tensor>>& grads);
  // Atomic checkpoint in dir/trainer.ckpt: weights, AdamW state, step count, CPU RNG state.
  void save(const std::string& dir) const;
  void load(const std::string& dir);

  int64_t stepCount() const { return step_; }
  const std::shared_ptr<Model> model;

 private:
  StepStats forwardBackward(const std::vector<TrainRow>& rows, const LossConfig& loss);
  std::unique_ptr<torch::optim::AdamW> makeOptimizer() const;
  const AdamWConfig cfg_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::AdamW> optim_;
  int64_t step_ = 0;
};

}  // namespace prime
