#include "batch_scheduler.h"

#include <algorithm>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>

namespace prime {

namespace {
bool before(const SeqPtr& a, const SeqPtr& b) {
  return a->req.priority < b->req.priority || (a->req.priority == b->req.priority && a->arrival < b->arrival);
}
}  // namespace

BatchScheduler::BatchScheduler(CacheManager& cache, int64_t maxSeqs, int64_t maxLen, int64_t maxTokens, int64_t vocab)
    : maxSequences(maxSeqs), maxSequenceLength(maxLen), maxBatchedTokens(maxTokens), vocabSize(vocab), cache_(cache) {}

std::vector<AddedSequence> BatchScheduler::add(const std::vector<SequenceRequest>& requests) {
  std::vector<AddedSequence> out;
  if (!preempted_.empty()) return out;  // they were admitted before: they resume first
  for (const SequenceRequest& r : requests) {
    if (int64_t(running_.size()) >= maxSequences) break;
    auto s = std::make_unique<Sequence>();
    s->id = nextId_;
    s->req = r;
    s->tokens = r.prompt;
    s->promptLen = int64_t(r.prompt.size());
    s->arrival = nextArrival_;
    if (!cache_.admit(*s, !running_.empty())) break;
    nextId_++;
    nextArrival_++;
    s->rng.seed(r.hasSeed ? r.seed : std::random_device{}());
    s->adjust = LogitAdjuster(r.sampling, r.stopTokenIds, vocabSize);
    out.push_back({s->id});
    insertRunning(std::move(s));
  }
  return out;
}

void BatchScheduler::insertRunning(SeqPtr s) {
  running_.insert(std::upper_bound(running_.begin(), running_.end(), s, before), std::move(s));
}

void BatchScheduler::restartPrefilling() {
  for (size_t i = running_.size(); i-- > 0;) {
    const Sequence& s = *running_[i];
    if (s.waiting() || s.computed < int64_t(s.tokens.size()) - 1) preempt(i, /*counted=*/false);
  }
}

void BatchScheduler::resumePreempted() {
  while (!preempted_.empty()) {
    if (int64_t(running_.size()) >= maxSequences || !cache_.admit(*preempted_.front(), !running_.empty())) break;
    insertRunning(std::move(preempted_.front()));
    preempted_.pop_front();
  }
}

void BatchScheduler::preempt(size_t index, bool counted) {
  SeqPtr s = std::move(running_[index]);
  running_.erase(running_.begin() + int64_t(index));
  cache_.release(*s, /*finished=*/false);
  s->computed = 0;
  s->cache.leader = s->cache.sharedLen = 0;
  s->cache.indexed = 0;
  if (!s->reported) {  // its prompt's outputs are computed again
    s->promptLogprobs.clear();
    s->promptRoutes.clear();
  }
  if (counted) preemptions_++;
  preempted_.insert(std::upper_bound(preempted_.begin(), preempted_.end(), s, before), std::move(s));
}

StepPlan BatchScheduler::plan(int64_t maxSteps) {
  for (;;) {
    StepPlan p;
    bool onlyDecode = preempted_.empty();
    int64_t budget = maxBatchedTokens;
    for (const SeqPtr& s : running_) {
      if (!s->waiting() && s->computed == int64_t(s->tokens.size()) - 1) {
        p.decode.push_back(s.get());
        budget--;
      } else {
        onlyDecode = false;
      }
    }
    for (const SeqPtr& s : running_) {
      const int64_t left = int64_t(s->tokens.size()) - s->computed;
      if (s->waiting() || left < 2 || budget <= 0) continue;
      p.chunks.emplace_back(s.get(), std::min(left, budget));
      budget -= p.chunks.back().second;
    }
    if (onlyDecode && maxSteps > 1 && !p.decode.empty()) {
      // As many steps as no sequence can end by its max tokens or the length limit before the last.
      p.steps = maxSteps;
      for (Sequence* s : p.decode)
        p.steps = std::min({p.steps, s->req.maxTokens - s->generated, maxSequenceLength - s->computed});
      p.steps = std::max<int64_t>(p.steps, 1);
    }
    std::vector<SequenceWrite> writes;
    for (Sequence* s : p.decode) writes.push_back({s, s->computed, s->computed + p.steps});
    for (auto& [s, n] : p.chunks) writes.push_back({s, s->computed, s->computed + n});
    if (cache_.reserve(writes)) return p;
    if (p.steps > 1) {
      maxSteps = 1;
      continue;
    }
    // The cache cannot hold this step's writes: the lowest-priority sequence (the latest admitted
    // among equals) gives its cache back and is computed again later. One sequence alone always
    // fits (the generator validates requests against the pool), so this ends.
    if (running_.size() <= 1) throw std::logic_error("KV cache: a lone sequence does not fit the pool");
    preempt(running_.size() - 1, /*counted=*/true);
  }
}

void BatchScheduler::applyToken(Sequence& s, const Sampled& sampled, StepToken& out) const {
  out.seqId = s.id;
  if (!s.reported) {
    out.first = s.reported = true;
    if (s.req.promptLogprobs) {
      if (s.promptLogprobs.empty())
        s.promptLogprobs.assign(size_t(s.promptLen), std::numeric_limits<float>::quiet_NaN());
      out.promptLogprobs = std::move(s.promptLogprobs);
    }
    if (s.req.returnRoutes) out.promptRoutes = std::move(s.promptRoutes);
  }
  if (sampled.token < 0 || s.failed) {
    // Non-finite K/V or logits (broken weights): this sequence ends with an error; the others go on.
    out.token = -1;
    out.logprob = std::numeric_limits<float>::quiet_NaN();
    out.finished = true;
    out.finishReason = "error";
    out.error = "the model produced non-finite logits (NaN or Inf): the served weights are broken";
    out.routes.clear();
    s.failed = true;
    return;
  }
  s.tokens.push_back(sampled.token);
  s.generated++;
  const auto& stops = s.req.stopTokenIds;
  std::string reason;
  if (std::find(stops.begin(), stops.end(), sampled.token) != stops.end()) reason = "stop";
  else if (s.generated >= s.req.maxTokens || s.computed >= maxSequenceLength) reason = "length";
  out.token = sampled.token;
  out.logprob = sampled.logprob;
  out.finished = !reason.empty();
  out.finishReason = reason;
}

void BatchScheduler::retire(const std::vector<StepToken>& out) {
  for (const StepToken& t : out) {
    if (!t.finished) continue;
    auto it = std::find_if(running_.begin(), running_.end(), [&](const SeqPtr& s) { return s->id == t.seqId; });
    if (it == running_.end()) continue;
    SeqPtr s = std::move(*it);
    running_.erase(it);
    cache_.release(*s, /*finished=*/true);
  }
}

std::vector<bool> BatchScheduler::remove(const std::vector<int64_t>& seqIds) {
  std::vector<bool> removed;
  for (int64_t id : seqIds) {
    auto it = std::find_if(running_.begin(), running_.end(), [&](const SeqPtr& s) { return s->id == id; });
    if (it != running_.end()) {
      SeqPtr s = std::move(*it);
      running_.erase(it);
      cache_.release(*s, /*finished=*/true);
      removed.push_back(true);
      continue;
    }
    auto p = std::find_if(preempted_.begin(), preempted_.end(), [&](const SeqPtr& s) { return s->id == id; });
    removed.push_back(p != preempted_.end());
    if (p != preempted_.end()) preempted_.erase(p);
  }
  return removed;
}

}  // namespace prime
