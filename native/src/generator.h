// Batched generation over the model's cache (continuous batching's engine; the inference server's
// scheduler feeds it requests). The generator is three parts behind one facade:
//   - the scheduler (batch_scheduler.h): admission, priorities, the token budget of a step
//     (decode rows first, prefill chunks beside them), preemption when the cache runs dry;
//   - the cache manager (cache_manager.h): what each sequence holds, across the cache's kinds
//     (cache_kind.h: paged KV blocks; state slots for hybrid models), and the prefix cache that
//     lets sequences share what others computed (prefix_cache.h: sharing off, live or cache);
//   - the model runner (model_runner.h): a step's inputs, the forward, sampling, CUDA graphs.
// A step goes: a new policy epoch if the weights changed, preempted sequences resumed, the plan
// (its writes prepared in the cache), the forward and sampling, the tokens applied (stops,
// lengths), computed blocks indexed, finished sequences released.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "batch_scheduler.h"
#include "cache_manager.h"
#include "generation.h"
#include "model.h"
#include "model_runner.h"

namespace prime {

class Generator {
 public:
  // checks: test-only (native/testing.ts).
  Generator(std::shared_ptr<Model> model, const GeneratorOptions& options, const GeneratorChecks& checks = {});

  // Admits the longest leading run of `requests` the cache has room for now (sequence slots, the
  // blocks of their prompts), none while preempted sequences wait to resume; the others stay
  // with the caller. Throws, admitting nothing, for a request that is invalid or could never fit.
  // Prefill happens in the coming steps: every sampled token (the first included) comes out of
  // step().
  std::vector<AddedSequence> add(const std::vector<SequenceRequest>& requests);
  // One step: a decode row for every running sequence that has one, prefill chunks within the
  // token budget. With maxSteps > 1 and only decode rows, up to maxSteps decode steps run in one
  // call, tokens fed back on the device, their results read once (no sequence runs past its
  // max tokens or the length limit meanwhile; one stopped by a stop token has its later tokens
  // dropped). Finished sequences free their blocks.
  std::vector<StepToken> step(int64_t maxSteps = 1);
  // Frees the sequences' blocks (aborts), running or preempted; false for ids that are not live.
  std::vector<bool> remove(const std::vector<int64_t>& seqIds);

  // Readable from the JS thread while a call runs elsewhere.
  GeneratorStats stats() const;
  // CUDA graphs captured, and why steps run eagerly ("" while graphs serve them).
  int64_t cudaGraphs() const { return runner_->cudaGraphs(); }
  std::string eagerReason() const { return runner_->eagerReason(); }

  const int64_t maxSequences, maxSequenceLength, blockSize, maxBatchedTokens;
  const PrefixSharing prefixSharing;
  const std::shared_ptr<Model> model;
  int64_t numBlocks() const { return cache_->numBlocks(); }
  int64_t capacityTokens() const { return cache_->capacityTokens(); }

 private:
  void validate(const SequenceRequest& r) const;
  // A step with prefill chunks (and the decode rows beside them): one forward.
  std::vector<StepToken> runMixed(const StepPlan& p, Laps& lap);
  // Decode rows only: p.steps steps, tokens fed back on the device (CUDA graphs where they serve).
  std::vector<StepToken> runDecode(const StepPlan& p, Laps& lap);
  // After a forward: computed blocks indexed, finished sequences released.
  void finishStep(const std::vector<StepToken>& out);
  void publishStats();

  StepTimes times_;
  std::unique_ptr<CacheManager> cache_;
  std::unique_ptr<BatchScheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  int64_t prefillTokens_ = 0;
  mutable std::mutex statsMutex_;  // stats_ is read from the JS thread
  GeneratorStats stats_;
};

}  // namespace prime
