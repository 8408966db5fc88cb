// The generator's model runner: a step's inputs (token ids, positions, block tables) built and
// sent to the device, the forward over the cache, and sampling, on the host (CPU logits) or with
// tensor ops on the logits' device; decode steps replayed from CUDA graphs where they serve
// (decode_graph.h). What the sampled tokens do to the sequences is the generator's.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "batch_scheduler.h"
#include "cache_manager.h"
#include "cuda_info.h"
#include "decode_graph.h"
#include "generation.h"
#include "model.h"
#include "sampler.h"

namespace prime {

// Splits a step's time into its parts: each call adds the time since the previous one to a part.
struct Laps {
  std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
  void operator()(double& part) {
    const auto now = std::chrono::steady_clock::now();
    part += std::chrono::duration<double>(now - t).count();
    t = now;
  }
};

class ModelRunner {
 public:
  // Adds its parts of the steps' time to `times`.
  ModelRunner(std::shared_ptr<Model> model, CacheManager& cache, const GeneratorOptions& options, StepTimes& times);

  // One forward over a plan's decode rows and prefill chunks. Marks the sequences whose chunk came
  // out non-finite as failed and collects the prompt outputs (logprobs, routes) asked for.
  struct Mixed {
    std::vector<SequenceWrite> rows;  // the decode rows, then the chunks: positions [from, to)
    std::vector<int64_t> first;       // the index of each row's first token in `hidden`
    at::Tensor hidden;                // [tokens, D]
    MoeRouting routing;               // with returnRoutes
    std::unique_ptr<DeviceTimer> device;
  };
  Mixed forwardMixed(const StepPlan& p, Laps& lap);
  // Samples hidden row rows[i] of a mixed forward for seqs[i] into sampled[i] (out[i] gets its top
  // logprobs and routes).
  void sampleMixed(Mixed& f, const std::vector<Sequence*>& seqs, const std::vector<int64_t>& rows,
                   std::vector<Sampled>& sampled, std::vector<StepToken>& out, Laps& lap);
  // p.steps decode steps over p.decode, each step's tokens fed to the next on the device; per step
  // j and row b: sampled[j][b], outs[j][b] (top logprobs), routing[j] (with returnRoutes).
  struct Decoded {
    std::vector<std::vector<Sampled>> sampled;
    std::vector<std::vector<StepToken>> outs;
    std::vector<MoeRouting> routing;
  };
  Decoded decode(const StepPlan& p, Laps& lap);
  // Rows [from, from + n) of one forward's routes as [n, sparse layers, K] int32, flattened.
  std::vector<int32_t> routes(const MoeRouting& routing, int64_t from, int64_t n) const;

  // CUDA graphs captured, and why steps run eagerly ("" while graphs serve them); readable from
  // the JS thread while a call runs elsewhere.
  int64_t cudaGraphs() const { return graphCount_.load(); }
  std::string eagerReason() const;

 private:
  // Row i of logits sampled for seqs[i]: on the host (CPU logits), or with tensor ops.
  void sampleLogits(const std::vector<Sequence*>& seqs, const at::Tensor& logits, std::vector<Sampled>& sampled,
                    std::vector<StepToken>& out);

  const std::shared_ptr<Model> model_;
  CacheManager& cache_;
  const int64_t maxSequenceLength_, blockSize_;
  const bool tensorSampler_, pagedAttentionKernel_;
  StepTimes& times_;
  std::unique_ptr<DecodeGraphs> graphs_;  // null: eager steps, for eagerReason_
  std::string eagerReason_;
  mutable std::mutex reasonMutex_;  // eagerReason_ is read from the JS thread
  std::atomic<int64_t> graphCount_{0};
};

}  // namespace prime
