// Batched generation over a paged KV cache (continuous batching's engine; the inference server's
// scheduler feeds it requests). Each step runs one forward over the decode rows of the running
// sequences and, within a token budget, chunks of the prompts still being prefilled, so a long
// prompt never stalls the sequences already decoding. A sequence holds the blocks its tokens fill
// (block_pool.h), taken as it grows; it is admitted when the blocks of its prompt are free, not
// for its worst case; when the pool runs dry a step preempts the lowest-priority sequence (its
// blocks freed, its tokens recomputed when blocks are free again: the same tokens, as its sampler
// state goes with it). Sequences with a common prefix share its blocks (prefix_cache.h): prefilled
// once, copied on write where they part.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "block_pool.h"
#include "decode_graph.h"
#include "model.h"
#include "prefix_cache.h"
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
// prefixes of finished ones, kept until their blocks are needed (an LRU cache).
enum class PrefixSharing { kOff, kLive, kCache };

struct GeneratorOptions {
  int64_t maxSequences = 0;       // sequences running at once (decoded together)
  int64_t maxSequenceLength = 0;  // longest prompt + completion
  // The pool's size in token positions, rounded up to whole blocks. 0: with gpuMemoryUtilization
  // (CUDA only), what that share of the device leaves after the weights and a forward of
  // maxBatchedTokens tokens; else maxSequences x maxSequenceLength.
  int64_t kvCacheTokens = 0;
  double gpuMemoryUtilization = 0;  // in (0, 1]; 0: unset
  int64_t blockSize = 16;
  PrefixSharing prefixSharing = PrefixSharing::kCache;
  // Tokens per step: decode rows first, prefill chunks in the rest (vLLM's max_num_batched_tokens).
  int64_t maxBatchedTokens = 2048;
  // Sample with tensor ops (tensor_sampler.h) even on the CPU, where the host sampler is the
  // default (how tests check the path logits on CUDA take).
  bool tensorSampler = false;
  // Replay decode steps from CUDA graphs where the model allows (decode_graph.h); false: eager.
  bool cudaGraphs = true;
  // Decode rows' attention through our CUDA paged decode kernel (paged_decode.h) instead of
  // libtorch's batched matmuls over gathered blocks; refused where the build or device lacks it.
  bool pagedAttentionKernel = false;
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
  int64_t preemptions = 0;  // since start
  // Since start: prompt positions computed (with those of preempted sequences computed again), and
  // positions taken from blocks others computed.
  int64_t prefillTokens = 0, prefixHitTokens = 0;
  StepTimes times;
};

class Generator {
 public:
  Generator(std::shared_ptr<Model> model, const GeneratorOptions& options);

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
  int64_t liveSequences() const { return live_.load(); }
  // CUDA graphs captured, and why steps run eagerly ("" while graphs serve them).
  int64_t cudaGraphs() const { return graphCount_.load(); }
  std::string eagerReason() const;

  const int64_t maxSequences, maxSequenceLength, blockSize, maxBatchedTokens;
  const PrefixSharing prefixSharing;
  const bool tensorSampler, pagedAttentionKernel;
  const std::shared_ptr<Model> model;
  int64_t numBlocks() const { return pool_->numBlocks(); }
  int64_t capacityTokens() const { return numBlocks() * blockSize; }

 private:
  struct Sequence {
    int64_t id;
    SequenceRequest req;
    std::vector<int64_t> tokens;  // the prompt, then the sampled tokens
    int64_t promptLen;
    int64_t computed = 0;  // tokens[0, computed) have their K/V in `blocks`
    std::vector<int32_t> blocks;
    std::vector<BlockHash> keys;  // prefix-cache keys of the full blocks of tokens, as far as known
    int64_t indexed = 0;          // leading blocks indexed as computed
    uint64_t epoch = 0;           // the policy epoch its K/V were computed under
    int64_t generated = 0;
    std::mt19937_64 rng;
    LogitAdjuster adjust;  // logit bias, min_tokens, penalties: sampler state, like rng
    uint64_t arrival;
    // A follower waits until its leader has computed tokens[0, sharedLen) into the blocks they
    // share; with sharedLen = tokens.size() it then samples from the leader's row for the last one.
    int64_t leader = 0, sharedLen = 0;
    bool reported = false;  // its first token went out (with the prompt's logprobs and routes)
    std::vector<float> promptLogprobs;
    std::vector<int32_t> promptRoutes;
    bool failed = false;  // non-finite K/V or logits
    bool needsPromptOutputs() const { return !reported && (req.promptLogprobs || req.returnRoutes); }
  };
  using SeqPtr = std::unique_ptr<Sequence>;
  struct Plan;
  struct Laps;

  void validate(const SequenceRequest& r) const;
  // Takes the blocks for s's tokens (shared ones first) if the pool has room; false otherwise.
  bool admit(Sequence& s);
  // The leading blocks of s's tokens other sequences hold: how many are computed, how many a
  // leader is computing, and whether the partial last block comes with them.
  struct Match {
    std::vector<int32_t> blocks;
    int64_t computedTokens = 0, sharedTokens = 0;
    int64_t leader = 0;
  };
  Match matchPrefix(const Sequence& s) const;
  void computeKeys(Sequence& s) const;  // the keys of its full blocks under the current epoch
  // Indexes s's full blocks up to `computed` as computed, once they are.
  void indexComputed(Sequence& s);

  // A weight change since the last call: a new epoch (the prefix cache forgets) and the sequences
  // still prefilling start over (their K/V so far are the old policy's).
  void syncEpoch();
  void resumePreempted();
  Plan plan(int64_t maxSteps);
  // Makes positions [from, to) of s writable: blocks taken as it grows, a shared partial block
  // copied first (copy-on-write). The pool has the blocks (checked by the caller).
  void prepareWrites(Sequence& s, int64_t from, int64_t to);
  int64_t blocksNeeded(const Sequence& s, int64_t from, int64_t to) const;
  bool copiesOnWrite(const Sequence& s, int32_t block) const;
  bool hasWaitingFollowers(int64_t id) const;
  // Frees s's blocks and queues it to be recomputed (preempted: counted).
  void preempt(size_t runningIndex, bool counted);
  // Frees s's blocks; hands the prefix it was computing for followers to the one sharing most.
  void releaseBlocks(Sequence& s);
  void promoteFollowers(const Sequence& leaving);
  void zeroBlock(int32_t b);     // a poisoned block, freed: its non-finite K/V must not be read as 0 * NaN
  void insertRunning(SeqPtr s);  // keeps running_ in (priority, arrival) order
  Sequence* findRunning(int64_t id) const;

  // A step with prefill chunks (and the decode rows beside them): one forward.
  std::vector<StepToken> runMixed(Plan& p, Laps& lap);
  // Decode rows only: p.steps steps, tokens fed back on the device (CUDA graphs where they serve).
  std::vector<StepToken> runDecode(Plan& p, Laps& lap);
  // Row i of logits sampled for seqs[i]: on the host (CPU logits), or with tensor ops.
  void sampleLogits(const std::vector<Sequence*>& seqs, const at::Tensor& logits, std::vector<Sampled>& sampled,
                    std::vector<StepToken>& out);
  // A sampled token for s: stop / length / error; out gets the token's record.
  void applyToken(Sequence& s, const Sampled& sampled, StepToken& out);
  // Ends the finished sequences of `out` (their blocks freed).
  void retire(const std::vector<StepToken>& out);
  void publishStats();

  std::unique_ptr<PrefixCache> prefixes_;
  std::unique_ptr<BlockPool> pool_;
  PagedKV cache_;
  std::unique_ptr<DecodeGraphs> graphs_;  // null: eager steps, for eagerReason_
  std::string eagerReason_;
  mutable std::mutex reasonMutex_;  // eagerReason_ is read from the JS thread
  std::atomic<int64_t> graphCount_{0};
  std::vector<SeqPtr> running_;   // by (priority, arrival): the last is the first preempted
  std::deque<SeqPtr> preempted_;  // by (priority, arrival): the first resumes first
  int64_t nextId_ = 1;
  uint64_t nextArrival_ = 0, epoch_ = 0, weightsSeen_ = 0;
  int64_t preemptions_ = 0, prefillTokens_ = 0, prefixHitTokens_ = 0;
  StepTimes times_;
  mutable std::mutex statsMutex_;  // stats_ is read from the JS thread
  GeneratorStats stats_;
  std::atomic<int64_t> live_{0};
};

}  // namespace prime
