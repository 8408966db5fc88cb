// Batched generation over a slot-based KV cache. Sequences join (prefill) and leave between
// decode steps; the inference server builds continuous batching on top of this.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "decode_graph.h"
#include "model.h"
#include "sampler.h"

namespace prime {

struct SequenceRequest {
  std::vector<int64_t> prompt;
  SamplingParams sampling;
  int64_t maxTokens = 16;
  std::vector<int64_t> stopTokenIds;
  bool hasSeed = false;
  uint64_t seed = 0;
  bool promptLogprobs = false;
  int64_t topLogprobs = 0;    // per sampled token, the k most likely tokens (0..kMaxTopLogprobs)
  bool returnRoutes = false;  // MoE: the experts each fed token was routed to (router replay)
};

constexpr int64_t kMaxTopLogprobs = 20;
// Prompt tokens per prefill forward: the prompts admitted together are packed into forwards of at
// most this many tokens (a longer prompt goes alone). Large enough that the matmuls are efficient,
// small enough that a forward's activations stay modest (4096 x intermediate width floats).
constexpr int64_t kPrefillTokens = 4096;

struct AddedSequence {
  int64_t seqId;
  std::vector<float> promptLogprobs;  // per prompt token (NaN for the first); empty unless asked
  // With returnRoutes: prompt tokens 0..P-2 (the prefill) x sparse layers x experts per token.
  std::vector<int32_t> promptRoutes;
};

struct StepToken {
  int64_t seqId, token;
  float logprob;
  bool finished;
  std::string finishReason;  // "stop" | "length" | "error" | "" while running
  std::string error;         // why, when finishReason is "error" (token is then -1)
  // When asked: the most likely tokens of the distribution `logprob` comes from, descending
  // (ties: lower id first).
  std::vector<int32_t> topIds;
  std::vector<float> topLogprobs;
  // With returnRoutes: the experts (sparse layers x experts per token) of the token fed in this
  // step, the one whose output `token` was sampled from.
  std::vector<int32_t> routes;
};

class Generator {
 public:
  // tensorSampler: sample with tensor ops (tensor_sampler.h) even on the CPU, where the host
  // sampler is the default (how tests check the path logits on CUDA take). cudaGraphs: replay
  // decode steps from CUDA graphs where the model allows (decode_graph.h); false: always eager.
  Generator(std::shared_ptr<Model> model, int64_t maxSequences, int64_t maxSequenceLength, bool tensorSampler = false,
            bool cudaGraphs = true);

  // Prefills each prompt into a free slot. The last prompt token is left pending: the next
  // step() feeds it, so every sampled token (the first included) comes out of step().
  std::vector<AddedSequence> add(const std::vector<SequenceRequest>& requests);
  // One batched decode step for every active sequence. Finished sequences free their slot.
  std::vector<StepToken> step();
  // Frees the sequences' slots (aborts); false for ids that are not active.
  std::vector<bool> remove(const std::vector<int64_t>& seqIds);

  // Readable from the JS thread while a call runs elsewhere.
  int64_t activeSequences() const { return active_.load(); }
  int64_t cachedTokens() const { return cached_.load(); }
  // CUDA graphs captured, and why steps run eagerly ("" while graphs serve them).
  int64_t cudaGraphs() const { return graphCount_.load(); }
  std::string eagerReason() const;
  const int64_t maxSequences, maxSequenceLength;
  const bool tensorSampler;
  const std::shared_ptr<Model> model;

 private:
  struct Sequence {
    int64_t id;
    int64_t cacheLen;  // tokens whose K/V are in the cache
    int64_t pending;   // next input token, at position cacheLen
    int64_t generated = 0;
    SequenceRequest req;
    std::mt19937_64 rng;
    bool failed = false;  // non-finite prefill or logits: its cache entries may hold NaN / Inf
  };
  void release(size_t slot);  // moves the last slot into `slot` so slots stay compact
  // A step's sampling on the host (sampler.h), logits copied there.
  void sampleOnHost(const at::Tensor& logits, std::vector<Sampled>& sampled, std::vector<StepToken>& out);
  // Applies a step's sampled tokens: stop / length / error, then frees the finished slots.
  void finishStep(const std::vector<Sampled>& sampled, std::vector<StepToken>& out, const MoeRouting& routing);
  void publishStats();

  KVCache cache_;
  std::unique_ptr<DecodeGraphs> graphs_;  // null: eager steps, for eagerReason_
  std::string eagerReason_;
  mutable std::mutex reasonMutex_;  // eagerReason_ is read from the JS thread
  std::atomic<int64_t> graphCount_{0};
  std::vector<Sequence> seqs_;  // seqs_[slot]
  int64_t nextId_ = 1;
  std::atomic<int64_t> active_{0}, cached_{0};
};

}  // namespace prime
