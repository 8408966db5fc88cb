#include "state_check.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <stdexcept>

namespace prime {

StatePathResult checkStatePath(const Model& model, const StatePathOptions& o) {
  c10::InferenceMode inference;
  const int64_t L = int64_t(o.prompt.size()), B = o.blockSize, steps = o.greedySteps;
  if (!model.hybrid()) throw std::runtime_error(model.cfg.arch + " has no Gated DeltaNet blocks");
  if (L < 2 || o.prefillChunk < 1 || B < 1 || steps < 0 || o.snapshotAt < 1 || o.snapshotAt >= L)
    throw std::runtime_error(
        "state check: needs a prompt of 2+ tokens, prefillChunk and blockSize >= 1, "
        "snapshotAt inside the prompt");
  model.checkTokenIds(o.prompt.data(), o.prompt.size());
  const auto longs = at::TensorOptions().dtype(at::kLong);
  const at::Device dev = model.device;
  // The paged cache of the full-attention blocks: enough blocks for the whole sequence.
  const int64_t total = L + steps, nb = (total + B - 1) / B;
  PagedKV cache;
  cache.numBlocks = nb;
  cache.blockSize = B;
  cache.k.resize(size_t(model.cfg.numLayers));
  cache.v.resize(size_t(model.cfg.numLayers));
  const auto kvOpts = model.options().dtype(model.computeDtype());
  for (int64_t l = 0; l < model.cfg.numLayers; l++)
    if (std::find(model.linearLayers().begin(), model.linearLayers().end(), l) == model.linearLayers().end()) {
      cache.k[size_t(l)] = at::zeros({nb + 2, B, model.cfg.numKvHeads, model.cfg.headDim}, kvOpts);
      cache.v[size_t(l)] = at::zeros({nb + 2, B, model.cfg.numKvHeads, model.cfg.headDim}, kvOpts);
    }
  const at::Tensor table = at::arange(nb, longs).unsqueeze(0).to(dev);
  LinearStates states = model.linearStates(3);

  std::vector<int64_t> ids = o.prompt;
  auto packed = [&](const std::vector<int64_t>& seq) {
    const int64_t n = int64_t(seq.size());
    return model.forwardPacked(at::tensor(seq, longs).to(dev), at::arange(n, longs).to(dev), {0});
  };
  auto maxDiff = [](const at::Tensor& a, const at::Tensor& b) {
    return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  };
  // Prefill of positions [from, L) in chunks, from `slot`, snapshots into slot 1 at snapshotAt.
  auto prefill = [&](int64_t from, int64_t slot, bool snapshot) {
    std::vector<at::Tensor> hidden;
    for (int64_t start = from; start < L; start += o.prefillChunk) {
      const int64_t len = std::min(o.prefillChunk, L - start);
      PagedBatch b;
      b.pos = at::arange(start, start + len, longs).to(dev);
      b.seqOf = at::zeros({len}, longs).to(dev);
      b.tables = table;
      b.chunkStart = {start};
      b.chunkLen = {len};
      b.slotOf = at::full({1}, slot, longs).to(dev);
      if (snapshot && o.snapshotAt > start && o.snapshotAt <= start + len) b.snapshots = {{{o.snapshotAt, 1}}};
      const std::vector<int64_t> chunk(ids.begin() + start, ids.begin() + start + len);
      hidden.push_back(model.forwardPaged(at::tensor(chunk, longs).to(dev), b, cache, nullptr, &states));
    }
    return at::cat(hidden, 0);
  };
  StatePathResult r;
  const at::Tensor reference = packed(ids);
  at::Tensor h = prefill(0, 0, true);
  r.prefillDiff = maxDiff(h, reference);
  states.copySlot(1, 2);
  r.snapshotDiff = maxDiff(prefill(o.snapshotAt, 2, false), reference.narrow(0, o.snapshotAt, L - o.snapshotAt));
  // Greedy decode from slot 0, one recurrent step per token.
  std::vector<at::Tensor> decoded;
  at::Tensor last = h.narrow(0, L - 1, 1);
  for (int64_t i = 0; i < steps; i++) {
    const int64_t next = model.logits(last).argmax(-1).item<int64_t>();
    r.greedy.push_back(next);
    ids.push_back(next);
    const int64_t p = int64_t(ids.size()) - 1;
    PagedBatch b;
    b.pos = at::full({1}, p, longs).to(dev);
    b.seqOf = at::zeros({1}, longs).to(dev);
    b.tables = table;
    b.decodeRows = 1;
    b.decodeKeys = p + 1;
    b.slotOf = at::zeros({1}, longs).to(dev);
    last = model.forwardPaged(at::full({1}, next, longs).to(dev), b, cache, nullptr, &states);
    decoded.push_back(last);
  }
  if (steps > 0) r.decodeDiff = maxDiff(at::cat(decoded, 0), packed(ids).narrow(0, L, steps));
  return r;
}

}  // namespace prime
