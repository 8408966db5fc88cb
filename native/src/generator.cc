#include "generator.h"

#include "paged_decode.h"

#include <algorithm>
#include <stdexcept>

namespace prime {

Generator::Generator(std::shared_ptr<Model> m, const GeneratorOptions& o, const GeneratorChecks& checks)
    : maxSequences(o.maxSequences), maxSequenceLength(o.maxSequenceLength), blockSize(o.blockSize),
      maxBatchedTokens(o.maxBatchedTokens), prefixSharing(o.prefixSharing), model(std::move(m)) {
  if (maxSequences <= 0 || maxSequenceLength <= 1)
    throw std::runtime_error("generator needs maxSequences >= 1 and maxSequenceLength >= 2");
  if (blockSize < 1 || blockSize > 1024) throw std::runtime_error("blockSize must be in [1, 1024]");
  if (maxBatchedTokens < maxSequences)
    throw std::runtime_error("maxBatchedTokens (" + std::to_string(maxBatchedTokens) +
                             ") must be at least maxSequences (" + std::to_string(maxSequences) +
                             "): every running sequence decodes in each step");
  if (o.kvCacheTokens < 0) throw std::runtime_error("kvCacheTokens must be >= 0 (0: unset)");
  if (!(o.gpuMemoryUtilization >= 0 && o.gpuMemoryUtilization <= 1))
    throw std::runtime_error("gpuMemoryUtilization must be in (0, 1] (0: unset)");
  if (o.gpuMemoryUtilization > 0 && !model->device.is_cuda())
    throw OptionError("gpuMemoryUtilization",
                      "sizes the KV cache of a CUDA device; the model is on " + model->device.str());
  if (o.pagedAttentionKernel) {
    // The most positions a decode step reads: the block tables' width in positions.
    const ArchConfig& c = model->cfg;
    const int64_t maxKeys = (maxSequenceLength + blockSize - 1) / blockSize * blockSize;
    const std::string why =
        pagedDecodeUnsupported(model->device, model->dtype, c.numHeads, c.numKvHeads, c.headDim, maxKeys);
    if (!why.empty()) throw OptionError("pagedAttentionKernel", why);
  }
  cache_ = std::make_unique<CacheManager>(model, o, checks);
  scheduler_ = std::make_unique<BatchScheduler>(*cache_, maxSequences, maxSequenceLength, maxBatchedTokens,
                                                model->cfg.vocabSize);
  runner_ = std::make_unique<ModelRunner>(model, *cache_, o, times_);
  publishStats();
}

void Generator::validate(const SequenceRequest& r) const {
  if (r.prompt.empty()) throw std::runtime_error("prompt must contain at least one token");
  if (int64_t(r.prompt.size()) > maxSequenceLength)
    throw std::runtime_error("prompt of " + std::to_string(r.prompt.size()) + " tokens exceeds maxSequenceLength " +
                             std::to_string(maxSequenceLength));
  if (r.maxTokens < 1) throw std::runtime_error("maxTokens must be >= 1");
  if (r.topLogprobs < 0 || r.topLogprobs > kMaxTopLogprobs)
    throw std::runtime_error("topLogprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "]");
  if (!(r.sampling.topP > 0 && r.sampling.topP <= 1)) throw std::runtime_error("topP must be in (0, 1]");
  if (r.sampling.temperature < 0 || r.sampling.minP < 0 || r.sampling.minP > 1)
    throw std::runtime_error("temperature must be >= 0 and minP in [0, 1]");
  if (const std::string e = samplingError(r.sampling, model->cfg.vocabSize); !e.empty()) throw std::runtime_error(e);
  // The most positions it may hold: every token fed (all but the last sampled one), at most the
  // length limit. More than the pool could never run, even alone.
  const int64_t most = std::min<int64_t>(int64_t(r.prompt.size()) + r.maxTokens - 1, maxSequenceLength);
  if (most > capacityTokens())
    throw std::runtime_error("prompt + maxTokens need up to " + std::to_string(most) +
                             " KV positions; the cache holds " + std::to_string(capacityTokens()) + " (" +
                             std::to_string(numBlocks()) + " blocks of " + std::to_string(blockSize) + ")");
  model->checkTokenIds(r.prompt.data(), r.prompt.size());
}

std::vector<AddedSequence> Generator::add(const std::vector<SequenceRequest>& requests) {
  c10::InferenceMode inference;
  for (const SequenceRequest& r : requests) validate(r);
  if (cache_->syncEpoch()) scheduler_->restartPrefilling();
  std::vector<AddedSequence> out = scheduler_->add(requests);
  publishStats();
  return out;
}

std::vector<StepToken> Generator::step(int64_t maxSteps) {
  c10::InferenceMode inference;
  if (maxSteps < 1) throw std::runtime_error("maxSteps must be >= 1");
  Laps lap;
  if (cache_->syncEpoch()) scheduler_->restartPrefilling();
  scheduler_->resumePreempted();
  const StepPlan p = scheduler_->plan(maxSteps);
  lap(times_.plan);
  std::vector<StepToken> out;
  if (!p.chunks.empty()) out = runMixed(p, lap);
  else if (!p.decode.empty()) out = runDecode(p, lap);
  if (!p.chunks.empty() || !p.decode.empty()) times_.calls++;
  publishStats();
  return out;
}

std::vector<StepToken> Generator::runMixed(const StepPlan& p, Laps& lap) {
  ModelRunner::Mixed f = runner_->forwardMixed(p, lap);
  const int64_t nd = int64_t(p.decode.size());
  for (size_t r = 0; r < f.rows.size(); r++) {
    const SequenceWrite& w = f.rows[r];
    prefillTokens_ += int64_t(r) < nd ? w.from < w.seq->promptLen  // a decode row: a prompt's last position
                                      : w.to - w.from;
  }
  // The rows sampled: decode rows, chunks that reached their sequence's last token, and followers
  // whose leader computed their shared prefix in this step (from the leader's row for their last
  // token when that prefix is all their tokens).
  std::vector<Sequence*> seqs;
  std::vector<int64_t> rows;
  for (size_t r = 0; r < f.rows.size(); r++) {
    Sequence& s = *f.rows[r].seq;
    s.computed = f.rows[r].to;
    if (s.computed == int64_t(s.tokens.size())) {
      seqs.push_back(&s);
      rows.push_back(f.first[r] + (f.rows[r].to - f.rows[r].from) - 1);
    }
  }
  for (const CacheManager::Followed& fl : cache_->resolveFollowers(f.rows)) {
    seqs.push_back(fl.follower);
    rows.push_back(f.first[size_t(fl.leaderRow - f.rows.data())] + (fl.position - fl.leaderRow->from));
  }
  std::vector<StepToken> out(seqs.size());
  if (!seqs.empty()) {
    std::vector<Sampled> sampled(seqs.size());
    runner_->sampleMixed(f, seqs, rows, sampled, out, lap);
    for (size_t i = 0; i < seqs.size(); i++) scheduler_->applyToken(*seqs[i], sampled[i], out[i]);
  }
  lap(times_.sample);  // (when nothing was sampled: the prompts' outputs)
  finishStep(out);
  lap(times_.finish);
  return out;
}

std::vector<StepToken> Generator::runDecode(const StepPlan& p, Laps& lap) {
  for (Sequence* s : p.decode) prefillTokens_ += s->computed < s->promptLen;  // a prompt's last position
  ModelRunner::Decoded d = runner_->decode(p, lap);
  const int64_t n = int64_t(p.decode.size());
  std::vector<StepToken> out;
  std::vector<char> ended(static_cast<size_t>(n), 0);
  for (int64_t j = 0; j < p.steps; j++)
    for (int64_t b = 0; b < n; b++) {
      if (ended[b]) continue;  // stopped at an earlier step of this call: the rest is dropped
      Sequence& s = *p.decode[b];
      StepToken& t = d.outs[size_t(j)][size_t(b)];
      s.computed++;
      if (s.req.returnRoutes) t.routes = runner_->routes(d.routing[size_t(j)], b, 1);
      scheduler_->applyToken(s, d.sampled[size_t(j)][size_t(b)], t);
      ended[b] = t.finished;
      if (t.finished && j + 1 < p.steps) s.cache.stateAhead = true;  // the later steps stepped its state on
      out.push_back(std::move(t));
    }
  finishStep(out);
  lap(times_.finish);
  return out;
}

void Generator::finishStep(const std::vector<StepToken>& out) {
  for (const SeqPtr& s : scheduler_->running()) cache_->indexComputed(*s);
  scheduler_->retire(out);
}

std::vector<bool> Generator::remove(const std::vector<int64_t>& seqIds) {
  c10::InferenceMode inference;
  std::vector<bool> removed = scheduler_->remove(seqIds);
  publishStats();
  return removed;
}

void Generator::publishStats() {
  GeneratorStats st;
  st.runningSequences = int64_t(scheduler_->running().size());
  st.preemptedSequences = scheduler_->preemptedCount();
  cache_->addStats(st);
  st.preemptions = scheduler_->preemptions();
  st.prefillTokens = prefillTokens_;
  st.times = times_;
  std::lock_guard<std::mutex> lock(statsMutex_);
  stats_ = st;
}

GeneratorStats Generator::stats() const {
  std::lock_guard<std::mutex> lock(statsMutex_);
  return stats_;
}

}  // namespace prime
