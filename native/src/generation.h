// What the generator's callers hand it and get back (requests, options, sampled tokens, stats),
// shared by its parts: the facade (generator.h), the scheduler, the cache manager and the model
// runner.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "facts.h"
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
#define PRIME_PREFIX_SHARINGS(X) X(kCache, "cache") X(kLive, "live") X(kOff, "off")
PRIME_ENUM(PrefixSharing, PRIME_PREFIX_SHARINGS, "PREFIX_SHARINGS")

// The generator's options (GeneratorOptions in TS), declared once (facts.h): the sizes every
// generator is given, X(name, type, doc), then the options with their defaults, X(name, type,
// default, doc). A new option is one line here (and its use in the engine).
#define PRIME_GENERATOR_SIZES(X)                                                     \
  X(maxSequences, int64_t, "The most sequences running (decoded together) at once.") \
  X(maxSequenceLength, int64_t, "Longest prompt + completion of one sequence.")
#define PRIME_GENERATOR_OPTIONS(X)                                                                                  \
  X(kvCacheTokens, int64_t, 0,                                                                                      \
    "The paged KV cache's size in token positions, rounded up to whole blocks. 0 (unset): with "                    \
    "`gpuMemoryUtilization`, what that share of the device leaves after the weights, a forward of "                 \
    "`maxBatchedTokens` tokens and the state slots; else maxSequences x maxSequenceLength.")                        \
  X(gpuMemoryUtilization, double, 0,                                                                                \
    "CUDA only, without kvCacheTokens: the share of the device's memory in use at most, in (0, 1] (vLLM's); 0: "    \
    "unset.")                                                                                                       \
  X(blockSize, int64_t, 16, "Token positions per KV block.")                                                        \
  X(prefixSharing, PrefixSharing, PrefixSharing::kCache,                                                            \
    "Sequences with a common token prefix share its blocks, prefilled once ('live': while they run together; "      \
    "'cache': also the prefixes of finished sequences, kept until their blocks are needed); 'off': each sequence "  \
    "computes all its tokens. Prefixes are keyed by the weights: any weight change makes them unmatchable.")        \
  X(maxBatchedTokens, int64_t, 2048,                                                                                \
    "Tokens one step computes: a decode row per running sequence, prefill chunks in the rest (vLLM's "              \
    "max_num_batched_tokens).")                                                                                     \
  X(stateSlots, int64_t, 0,                                                                                         \
    "Hybrid models (state layers, e.g. Gated DeltaNet): per-sequence state slots in all, one per running sequence " \
    "and the rest for the prefix cache's state snapshots. 0: maxSequences, twice that with prefixSharing 'cache'. " \
    "Refused for a model without state layers.")                                                                    \
  X(tensorSampler, bool, false,                                                                                     \
    "Sample with tensor ops on the logits' device, as it is done on CUDA, also on the CPU (where the host sampler " \
    "is the default). For tests of the CUDA path: same tokens for the same seeds.")                                 \
  X(cudaGraphs, bool, true,                                                                                         \
    "Replay decode steps from CUDA graphs (one per batch and key-length bucket, captured on first use) where the "  \
    "model allows: on CUDA, dense models. false: every step eager.")                                                \
  X(pagedAttentionKernel, bool, false,                                                                              \
    "Decode attention through the engine's own CUDA kernel (flash-decoding over the blocks in place) instead of "   \
    "libtorch's matmuls over gathered blocks; refused off CUDA or in a build without it.")

struct GeneratorOptions {
#define PRIME_GENERATOR_SIZE(name, type, doc) type name = 0;
  PRIME_GENERATOR_SIZES(PRIME_GENERATOR_SIZE)
#undef PRIME_GENERATOR_SIZE
#define PRIME_GENERATOR_OPTION(name, type, dflt, doc) type name = dflt;
  PRIME_GENERATOR_OPTIONS(PRIME_GENERATOR_OPTION)
#undef PRIME_GENERATOR_OPTION
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

// Where the steps' time went since creation (StepTimes in TS), in seconds of the host's clock
// unless said: X(name, type, doc).
#define PRIME_STEP_TIMES(X)                                                                                        \
  X(calls, int64_t, "`step` calls that ran something.")                                                            \
  X(steps, int64_t, "The forwards they ran (several per call with maxSteps).")                                     \
  X(plan, double, "Resuming preempted sequences, preempting, taking blocks (copy-on-write included).")             \
  X(inputs, double, "Token ids, positions and block tables built and sent to the device.")                         \
  X(forward, double, "The forwards and logits (on CUDA: launching them, or replaying graphs).")                    \
  X(attention, double, "Of which attention over the paged cache, on the CPU (CUDA's is launched asynchronously).") \
  X(sample, double, "Sampling and reading the tokens back (on CUDA: waiting for the device too).")                 \
  X(finish, double, "Stop and length checks, freeing blocks, the prefix index, the results.")                      \
  X(device, double, "CUDA: from each call's first launch to its last result, by the device's clock (0 elsewhere).")

struct StepTimes {
#define PRIME_STEP_TIME(name, type, doc) type name = 0;
  PRIME_STEP_TIMES(PRIME_STEP_TIME)
#undef PRIME_STEP_TIME
};

// A hybrid model's per-sequence state slots (StateSlotStats in TS; state_slots.h): X(name, doc).
#define PRIME_STATE_SLOT_STATS(X)                                                                      \
  X(slots, "Slots in all: one per running sequence, the rest for the prefix cache's state snapshots.") \
  X(inUse, "Held by running sequences.")                                                               \
  X(cached, "Holding state snapshots the prefix cache keeps for reuse.")                               \
  X(slotBytes, "The bytes of one slot.")

struct StateSlotStats {
#define PRIME_STATE_SLOT_STAT(name, doc) int64_t name = 0;
  PRIME_STATE_SLOT_STATS(PRIME_STATE_SLOT_STAT)
#undef PRIME_STATE_SLOT_STAT
};

// The cache's counters and gauges that cross N-API as they are (GeneratorCounters in TS, part of
// CacheStats): X(name, doc).
#define PRIME_GENERATOR_COUNTERS(X)                                                                             \
  X(runningSequences, "Sequences decoding or prefilling, holding their blocks.")                                \
  X(preemptedSequences, "Sequences preempted (blocks freed), waiting to be recomputed.")                        \
  X(cachedTokens, "Positions of the running sequences whose K/V are in the cache.")                             \
  X(blocksInUse, "Blocks some sequence holds.")                                                                 \
  X(blocksCached, "Blocks nobody holds that keep a finished sequence's prefix (reused, or taken when needed).") \
  X(preemptions, "Since creation: sequences preempted.")                                                        \
  X(prefillTokens,                                                                                              \
    "Since creation: prompt positions computed (those of preempted sequences computed again included).")        \
  X(prefixHitTokens, "Since creation: positions taken from blocks (and states) other sequences computed.")

// Counters and gauges of the cache, readable from the JS thread while a call runs elsewhere.
struct GeneratorStats {
#define PRIME_GENERATOR_COUNTER(name, doc) int64_t name = 0;
  PRIME_GENERATOR_COUNTERS(PRIME_GENERATOR_COUNTER)
#undef PRIME_GENERATOR_COUNTER
  StateSlotStats state;  // hybrid models; all 0 for a model without state layers
  StepTimes times;
};

}  // namespace prime
