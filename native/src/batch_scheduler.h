// The generator's scheduler: which sequences run and what each step computes. Sequences are
// admitted in the callers' order while the cache has room for them (cache_manager.h decides what
// room is) and run by (priority, arrival). Each step gives every running sequence that has one a
// decode row, then prefill chunks within the token budget (maxBatchedTokens), so a long prompt never
// stalls the sequences already decoding; with only decode rows and nobody waiting, several decode
// steps run in one call. When the cache cannot hold a step's writes, the lowest-priority sequence
// (the latest admitted among equals) is preempted: it gives back what it holds and is computed
// again, resumed before any new admission. A sampled token ends a sequence by a stop token or its
// length.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "cache_manager.h"
#include "generation.h"
#include "sequence.h"

namespace prime {

// What one step computes.
struct StepPlan {
  std::vector<Sequence*> decode;                      // one row each, first in the batch
  std::vector<std::pair<Sequence*, int64_t>> chunks;  // prefill: tokens [computed, computed + n)
  int64_t steps = 1;                                  // decode steps in this call (decode rows only)
};

class BatchScheduler {
 public:
  BatchScheduler(CacheManager& cache, int64_t maxSequences, int64_t maxSequenceLength, int64_t maxBatchedTokens,
                 int64_t vocabSize);

  // Admits the longest leading run of `requests` the cache has room for now (sequence slots, what
  // their prompts need), none while preempted sequences wait to resume; the others stay with the
  // caller. The requests are valid (the caller checked).
  std::vector<AddedSequence> add(const std::vector<SequenceRequest>& requests);
  // After a new policy epoch: sequences that have not sampled since they were admitted would go on
  // from K/V of the old policy, so they start over. Decoding ones keep theirs (a weight update
  // lands between two tokens).
  void restartPrefilling();
  void resumePreempted();
  // The rows of the next step, their writes prepared in the cache (preempting while they do not
  // fit); maxSteps > 1 allows several decode steps when nothing else runs.
  StepPlan plan(int64_t maxSteps);
  // A sampled token for s: stop / length / error; out gets the token's record.
  void applyToken(Sequence& s, const Sampled& sampled, StepToken& out) const;
  // Ends the finished sequences of `out` (their cache released).
  void retire(const std::vector<StepToken>& out);
  // Aborts sequences, running or preempted; false for ids that are not live.
  std::vector<bool> remove(const std::vector<int64_t>& seqIds);

  const std::vector<SeqPtr>& running() const { return running_; }
  int64_t preemptedCount() const { return int64_t(preempted_.size()); }
  int64_t preemptions() const { return preemptions_; }

  const int64_t maxSequences, maxSequenceLength, maxBatchedTokens, vocabSize;

 private:
  void insertRunning(SeqPtr s);  // keeps running_ in (priority, arrival) order
  // Releases s's cache and queues it to be computed again (preempted: counted).
  void preempt(size_t runningIndex, bool counted);

  CacheManager& cache_;
  std::vector<SeqPtr> running_;   // by (priority, arrival): the last is the first preempted
  std::deque<SeqPtr> preempted_;  // by (priority, arrival): the first resumes first
  int64_t nextId_ = 1;
  uint64_t nextArrival_ = 0;
  int64_t preemptions_ = 0;
};

}  // namespace prime
