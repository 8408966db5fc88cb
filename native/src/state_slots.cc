#include "state_slots.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace prime {

StateSlots::StateSlots(LinearStates states, const at::Device& device, PrefixCache& prefixes, const BlockPool& blocks,
                       const uint64_t& epoch, bool probe)
    : prefixes_(prefixes), blocks_(blocks), epoch_(epoch), states_(std::move(states)) {
  if (numSlots() < 1) throw std::runtime_error("stateSlots must be >= 1");
  if (probe) probe_ = std::make_unique<StateProbe>(numSlots(), device);
  for (int64_t s = numSlots() - 1; s >= 0; s--) free_.push_back(int32_t(s));  // slot 0 first out
}

void StateSlots::limitMatch(const Sequence& s, PrefixMatch& m) const {
  // Following a leader that has yet to compute the shared prefix: its forward writes the state
  // there into this sequence's slot.
  const Sequence* L = m.leaderSeq;
  if (m.leader && L && !L->waiting() && L->computed < m.sharedTokens) return;
  // Else the furthest snapshot the match's computed blocks lead to, before the last token (whose
  // logits are needed); or nothing (position 0).
  const int64_t n = int64_t(s.tokens.size()), B = prefixes_.blockSize();
  const int64_t computedBlocks = m.leader ? m.computedTokens / B : int64_t(m.blocks.size());
  PrefixMatch resumed;
  for (int64_t i = std::min(computedBlocks, (n - 1) / B); i >= 0; i--) {
    const BlockHash parent = PrefixCache::parentOf(s.cache.keys, i, epoch_);
    const int64_t* at = s.tokens.data() + i * B;
    const PrefixCache::Snapshot snap = prefixes_.findSnapshot(parent, at, std::min(B - 1, n - 1 - i * B));
    if (snap.slot < 0) continue;
    const int32_t partial = snap.tail > 0 ? prefixes_.findPartial(parent, at, snap.tail) : -1;
    if (snap.tail > 0 && partial < 0) continue;  // its partial block was evicted
    resumed.blocks.assign(m.blocks.begin(), m.blocks.begin() + i);
    resumed.computedTokens = resumed.sharedTokens = i * B + snap.tail;
    resumed.snapshot = snap.slot;
    resumed.partialBlock = partial;
    break;
  }
  m = resumed;
}

bool StateSlots::fits(const Sequence& s, const PrefixMatch& m, bool othersRun) const {
  // A free slot, or a snapshot's other than the one it resumes from.
  return int64_t(free_.size()) + prefixes_.snapshots() - (m.snapshot >= 0 ? 1 : 0) >= 1;
}

void StateSlots::admit(Sequence& s, const PrefixMatch& m) {
  if (m.snapshot >= 0) prefixes_.touchSnapshot(m.snapshot);  // used, and not the one evicted for its slot
  const int32_t slot = takeSlot();
  if (slot < 0) throw std::logic_error("state slots: none left to admit (fits says there is)");
  s.cache.slot = slot;
  if (m.snapshot >= 0) copySlot(m.snapshot, slot);
  // A first row that is a decode row at position 0 reads its slot (a chunk at 0 starts from zeros).
  else if (!m.leader && s.tokens.size() == 1) zeroSlot(slot);
}

void StateSlots::inherit(Sequence& heir, const Sequence& leaving) {
  if (leaving.waiting()) {  // its slot holds nothing yet (never expected: a follower leads nobody)
    heir.computed = 0;
    if (heir.tokens.size() == 1) zeroSlot(heir.cache.slot);
    return;
  }
  copySlot(leaving.cache.slot, heir.cache.slot);
  heir.computed = std::min(leaving.computed, heir.cache.sharedLen);
}

void StateSlots::release(Sequence& s, bool finished) {
  const int32_t slot = s.cache.slot;
  s.cache.slot = -1;
  if (slot < 0) return;
  if (!(finished && keepFinal(s, slot))) freeSlot(slot);
}

bool StateSlots::keepFinal(const Sequence& s, int32_t slot) {
  const SequenceCache& c = s.cache;
  if (!prefixes_.keepsSnapshots() || s.failed || s.waiting() || c.stateAhead || c.epoch != epoch_ || s.computed == 0)
    return false;
  const int64_t B = prefixes_.blockSize(), full = s.computed / B, tail = s.computed % B;
  if (int64_t(c.keys.size()) < full) return false;  // blocks not indexed (a collision kept them private)
  const BlockHash parent = PrefixCache::parentOf(c.keys, full, epoch_);
  const int64_t* at = s.tokens.data() + full * B;
  const PrefixCache::Snapshot same = prefixes_.findSnapshot(parent, at, tail);
  if (same.slot >= 0 && same.tail == tail) return false;  // kept already
  if (tail > 0) {
    // Its partial last block stays with the snapshot, indexed (and, freed next, parked) as
    // computed; only a block nobody else holds or indexes.
    const int32_t b = c.blocks[size_t(full)];
    if (blocks_.refs(b) != 1 || prefixes_.indexed(b) || !prefixes_.insertPartial(parent, at, tail, b)) return false;
  }
  return prefixes_.putSnapshot(parent, at, tail, slot);
}

void StateSlots::newEpoch() {
  for (int32_t slot : prefixes_.clearSnapshots()) freeSlot(slot);
}

void StateSlots::addStats(GeneratorStats& st) const {
  st.state.slots = numSlots();
  st.state.cached = prefixes_.snapshots();
  st.state.inUse = numSlots() - int64_t(free_.size()) - st.state.cached;
  st.state.slotBytes = states_.slotBytes();
}

StateSlots::StepState StateSlots::beforeForward(const std::vector<SequenceWrite>& rows, int64_t decodeRows,
                                                const std::vector<Sequence*>& holders) {
  for (const PendingSnapshot& p : pendingSnapshots_) freeSlot(p.slot);  // a forward that threw
  pendingSnapshots_.clear();
  pendingCopies_.clear();
  const int64_t B = prefixes_.blockSize();
  StepState st;
  for (size_t r = 0; r < rows.size(); r++) {
    const SequenceWrite& w = rows[r];
    const Sequence& s = *w.seq;
    st.slotOf.push_back(s.cache.slot);
    // The states its followers wait for: at the end of their shared prefix.
    std::vector<std::pair<int64_t, int32_t>> wanted;
    for (const Sequence* f : holders)
      if (f->cache.leader == s.id && w.from < f->cache.sharedLen && f->cache.sharedLen <= w.to)
        wanted.emplace_back(f->cache.sharedLen, f->cache.slot);
    if (int64_t(r) < decodeRows) {  // the row's slot ends there: copied after the forward
      for (auto& [pos, slot] : wanted) pendingCopies_.emplace_back(s.cache.slot, slot);
      continue;
    }
    // Its prompt's snapshot for the prefix cache: at the last block boundary before its last token.
    const int64_t q = (s.promptLen - 1) / B * B;
    if (prefixes_.keepsSnapshots() && q > w.from && q <= w.to && s.cache.epoch == epoch_ &&
        int64_t(s.cache.keys.size()) >= q / B &&
        prefixes_.findSnapshot(PrefixCache::parentOf(s.cache.keys, q / B, epoch_), nullptr, 0).slot < 0) {
      const int32_t slot = takeSlot();
      if (slot >= 0) {
        wanted.emplace_back(q, slot);
        pendingSnapshots_.push_back({&s, q, slot});
      }
    }
    // One snapshot per position (the forward's contract); others at the same position are copies of it.
    std::sort(wanted.begin(), wanted.end());
    std::vector<StateSnapshot> snaps;
    for (auto& [pos, slot] : wanted) {
      if (!snaps.empty() && snaps.back().position == pos) pendingCopies_.emplace_back(int32_t(snaps.back().slot), slot);
      else snaps.push_back({pos, slot});
    }
    st.snapshots.push_back(std::move(snaps));
  }
  return st;
}

void StateSlots::afterForward() {
  for (auto& [from, to] : pendingCopies_) copySlot(from, to);
  pendingCopies_.clear();
  for (const PendingSnapshot& p : pendingSnapshots_) {
    const Sequence& s = *p.seq;
    const bool kept = !s.failed && prefixes_.putSnapshot(
                                       PrefixCache::parentOf(s.cache.keys, p.position / prefixes_.blockSize(), epoch_),
                                       nullptr, 0, p.slot);
    if (!kept) freeSlot(p.slot);
  }
  pendingSnapshots_.clear();
}

int32_t StateSlots::takeSlot() {
  if (!free_.empty()) {
    const int32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  return prefixes_.evictSnapshot();
}

void StateSlots::copySlot(int32_t from, int32_t to) {
  states_.copySlot(from, to);
  if (probe_) probe_->copySlot(from, to);
}

void StateSlots::zeroSlot(int32_t slot) {
  for (std::vector<at::Tensor>* v : {&states_.conv, &states_.recurrent})
    for (at::Tensor& t : *v)
      if (t.defined()) t[slot].zero_();
  if (probe_) probe_->zeroSlot(slot);
}

}  // namespace prime
