// What the generator's callers hand it and get back (requests, options, sampled tokens, stats),
// shared by its parts: the facade (generator.h), the scheduler, the cache manager and the model
// runner.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
  // Lower runs first (vLLM's priority): a dry pool preempts the highest value, the latest
  // admitted among equals; preempted sequences resume in the same order.
  int64_t priority = 0;
};

constexpr int64_t kMaxTopLogprobs = 20;

// What is shared between sequences: nothing; prefixes of sequences alive together; or also the
// prefixes of finished ones, kept until their blocks are needed (an LRU cache). The prefix cache
// (prefix_cache.h) holds the mode: nothing else branches on it.
enum class PrefixSharing { kOff, kLive, kCache };

struct GeneratorOptions {
  int64_t maxSequences = 0;       // sequences running at once (decoded together)
  int64_t maxSequenceLength = 0;  // longest prompt + completion
  // The pool's size in token positions, rounded up to whole blocks. 0: with gpuMemoryUtilization
  // (CUDA only), what that share of the device leaves after the weights, a forward of
  // maxBatchedTokens tokens and the state slots; else maxSequences x maxSequenceLength.
  int64_t kvCacheTokens = 0;
  double gpuMemoryUtilization = 0;  // in (0, 1]; 0: unset
  int64_t blockSize = 16;
  PrefixSharing prefixSharing = PrefixSharing::kCache;
  // Tokens per step: decode rows first, prefill chunks in the rest (vLLM's max_num_batched_tokens).
  int64_t maxBatchedTokens = 2048;
  // Hybrid models (state_slots.h): per-sequence state slots in all, for the running sequences and
  // the prefix cache's snapshots. 0: maxSequences, twice that with prefixSharing kCache.
  int64_t stateSlots = 0;
  // Sample with tensor ops (tensor_sampler.h) even on the CPU, where the host sampler is the
  // default (how tests check the path logits on CUDA take).
  bool tensorSampler = false;
  // Replay decode steps from CUDA graphs where the model allows (decode_graph.h); false: eager.
  bool cudaGraphs = true;
  // Decode rows' attention through our CUDA paged decode kernel (paged_decode.h) instead of
  // libtorch's batched matmuls over gathered blocks; refused where the build or device lacks it.
  bool pagedAttentionKernel = false;
};

// Test-only settings of a generator (native/testing.ts), never set by the production facade.
struct GeneratorChecks {
  // Run the state-slot kind with a probe state (state_probe.h) even for a model without state
  // layers, and check every slot's contents before each forward: the state bookkeeping end to end.
  bool stateProbe = false;
};

struct AddedSequence {
  int64_t seqId;
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
  // With a sequence's first token, when asked: the prompt's logprobs (NaN for the first token)
  // and the routes of prompt tokens 0..P-2 (the last one's are `routes`).
  std::vector<float> promptLogprobs;
  std::vector<int32_t> promptRoutes;
  bool first = false;  // the sequence's first token (the prompt fields above come with it)
};

// Where the steps' time went since creation, in seconds of the host's clock unless said.
struct StepTimes {
  int64_t calls = 0, steps = 0;  // step() calls that ran something; forwards they ran
  double plan = 0;               // resuming preempted sequences, preempting, blocks (copy-on-write included)
  double inputs = 0;             // token ids, positions and block tables built and sent to the device
  double forward = 0;            // the model's forwards and logits (on CUDA: launching them, replaying graphs)
  double attention = 0;          // of which attention over the paged cache (on the CPU; CUDA's is launched)
  double sample = 0;             // sampling, and reading the tokens back (on CUDA: waiting for the device too)
  double finish = 0;             // stop and length checks, freeing blocks, the prefix index, the results
  double device = 0;             // CUDA: from a call's first launch to its last result, by the device's clock
};

// Counters and gauges of the cache, readable from the JS thread while a call runs elsewhere.
struct GeneratorStats {
  int64_t running = 0, preempted = 0;  // sequences holding blocks; waiting to be recomputed
  int64_t cachedTokens = 0;            // positions of the running sequences with their K/V in
  int64_t blocksInUse = 0, blocksCached = 0;
  // Hybrid models: state slots in all, held by running sequences, and holding the prefix cache's
  // snapshots; the bytes of one slot. All 0 for a model without state layers.
  int64_t stateSlots = 0, stateSlotsInUse = 0, stateSlotsCached = 0, stateSlotBytes = 0;
  int64_t preemptions = 0;  // since start
  // Since start: prompt positions computed (with those of preempted sequences computed again), and
  // positions taken from blocks (and states) others computed.
  int64_t prefillTokens = 0, prefixHitTokens = 0;
  StepTimes times;
};

}  // namespace prime
