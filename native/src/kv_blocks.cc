#include "kv_blocks.h"

#include <algorithm>

namespace prime {

namespace {
int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool isLinear(const Model& model, int64_t layer) {
  const std::vector<int64_t>& l = model.linearLayers();
  return std::find(l.begin(), l.end(), layer) != l.end();
}
}  // namespace

KvBlocks::KvBlocks(const Model& model, int64_t numBlocks, int64_t blockSize, PrefixCache& prefixes)
    : prefixes_(prefixes), pool_(numBlocks, prefixes) {
  const ArchConfig& c = model.cfg;
  kv_.numBlocks = numBlocks;
  kv_.blockSize = blockSize;
  kv_.k.resize(size_t(c.numLayers));
  kv_.v.resize(size_t(c.numLayers));
  // Attention blocks only: a hybrid model's Gated DeltaNet blocks keep state slots instead
  // (state_slots.h), and their entries stay undefined.
  for (int64_t l = 0; l < c.numLayers; l++)
    if (!isLinear(model, l)) {
      // Zeroed: the null block must read as zeros, and masked positions still enter probs @ V as
      // 0 * v (uninitialised memory may be NaN).
      kv_.k[size_t(l)] = at::zeros({numBlocks + 2, blockSize, c.numKvHeads, c.headDim}, model.options());
      kv_.v[size_t(l)] = at::zeros({numBlocks + 2, blockSize, c.numKvHeads, c.headDim}, model.options());
    }
}

int64_t KvBlocks::blockBytes(const Model& model, int64_t blockSize) {
  const ArchConfig& c = model.cfg;
  const int64_t attentionLayers = c.numLayers - int64_t(model.linearLayers().size());
  return 2 * attentionLayers * blockSize * c.numKvHeads * c.headDim * int64_t(at::elementSize(model.dtype));
}

bool KvBlocks::fits(const Sequence& s, const PrefixMatch& m, bool othersRun) const {
  const int64_t fresh = ceilDiv(int64_t(s.tokens.size()), blockSize()) - int64_t(m.blocks.size());
  // Shared blocks parked in the prefix cache leave available() when taken up again.
  int64_t parked = 0;
  for (int32_t b : m.blocks) parked += pool_.refs(b) == 0;
  if (m.partialBlock >= 0) parked += pool_.refs(m.partialBlock) == 0;  // held while it is copied
  // While others run, a little room stays for their growth, so an admission is not undone by a
  // preemption at the next step (vLLM's watermark: 1% of the pool).
  const int64_t watermark = othersRun ? std::max<int64_t>(1, numBlocks() / 100) : 0;
  return fresh + parked + watermark <= pool_.available();
}

void KvBlocks::admit(Sequence& s, const PrefixMatch& m) {
  const int64_t fresh = ceilDiv(int64_t(s.tokens.size()), blockSize()) - int64_t(m.blocks.size());
  for (int32_t b : m.blocks) pool_.retain(b);
  // A snapshot's partial block (state_slots.h) is copied into the first fresh one; held
  // meanwhile, so that taking the fresh blocks does not evict it.
  if (m.partialBlock >= 0) pool_.retain(m.partialBlock);
  s.cache.blocks = m.blocks;
  for (int64_t i = 0; i < fresh; i++) s.cache.blocks.push_back(pool_.take());
  if (m.partialBlock >= 0) {
    copyBlock(m.partialBlock, s.cache.blocks[m.blocks.size()]);
    pool_.release(m.partialBlock);  // parked again (it stays indexed, computed)
  }
}

int64_t KvBlocks::blocksNeeded(const SequenceWrite& w) const {
  const std::vector<int32_t>& blocks = w.seq->cache.blocks;
  int64_t need = 0;
  for (int64_t j = w.from / blockSize(); j * blockSize() < w.to; j++)
    need += j >= int64_t(blocks.size()) || copiesOnWrite(w, blocks[j]);
  return need;
}

bool KvBlocks::writesFit(const std::vector<SequenceWrite>& writes) const {
  int64_t need = 0;
  for (const SequenceWrite& w : writes) need += blocksNeeded(w);
  return need <= pool_.available();
}

void KvBlocks::prepareWrites(const std::vector<SequenceWrite>& writes) {
  for (const SequenceWrite& w : writes) {
    std::vector<int32_t>& blocks = w.seq->cache.blocks;
    for (int64_t j = w.from / blockSize(); j * blockSize() < w.to; j++) {
      if (j >= int64_t(blocks.size())) {
        blocks.push_back(pool_.take());
      } else if (copiesOnWrite(w, blocks[j])) {
        const int32_t old = blocks[j], fresh = pool_.take();
        copyBlock(old, fresh);
        if (pool_.release(old)) zeroBlock(old);  // (still referenced by the others)
        blocks[j] = fresh;
      } else if (prefixes_.holdsComputed(blocks[j])) {
        // Its own now (a sequence computing its cached last position again): rewritten in place,
        // it leaves the index until it is computed again (CacheManager::indexComputed).
        prefixes_.forget(blocks[j]);
      }
    }
  }
}

void KvBlocks::release(Sequence& s, bool finished) {
  if (s.failed)
    for (int32_t b : s.cache.blocks) pool_.poison(b);
  // Tail first (vLLM's rule): freed computed blocks are parked in this order, and evicted least
  // recently parked first, so of a prefix the first block, which every reuse needs, goes last.
  for (auto b = s.cache.blocks.rbegin(); b != s.cache.blocks.rend(); ++b)
    if (pool_.release(*b)) zeroBlock(*b);
  s.cache.blocks.clear();
}

void KvBlocks::addStats(GeneratorStats& st) const {
  st.blocksInUse = pool_.inUse();
  st.blocksCached = prefixes_.parked();
}

void KvBlocks::copyBlock(int32_t from, int32_t to) {
  for (size_t l = 0; l < kv_.k.size(); l++) {
    if (!kv_.k[l].defined()) continue;  // a Gated DeltaNet block
    kv_.k[l][to].copy_(kv_.k[l][from]);
    kv_.v[l][to].copy_(kv_.v[l][from]);
  }
}

void KvBlocks::zeroBlock(int32_t b) {
  for (size_t l = 0; l < kv_.k.size(); l++) {
    if (!kv_.k[l].defined()) continue;
    kv_.k[l][b].zero_();
    kv_.v[l][b].zero_();
  }
}

}  // namespace prime
