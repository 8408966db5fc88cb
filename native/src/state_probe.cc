#include "state_probe.h"

#include <stdexcept>
#include <string>

namespace prime {

namespace {
// hash(t_0 .. t_{n-1}) = sum_i (t_i + 1) kBase^(n-1-i) mod kPrime: products stay below 2^41.
constexpr int64_t kPrime = 1000003, kBase = 131;

int64_t powMod(int64_t e) {
  int64_t r = 1, b = kBase;
  for (; e > 0; e >>= 1) {
    if (e & 1) r = r * b % kPrime;
    b = b * b % kPrime;
  }
  return r;
}

int64_t digestOf(const std::vector<int64_t>& tokens, int64_t n) {
  int64_t h = 0;
  for (int64_t i = 0; i < n; i++) h = (h * kBase + tokens[size_t(i)] + 1) % kPrime;
  return h;
}

const auto kLong = at::TensorOptions().dtype(at::kLong);
}  // namespace

StateProbe::StateProbe(int64_t numSlots, const at::Device& device)
    : digest_(at::zeros({numSlots + 1, 2}, kLong.device(device))) {}

void StateProbe::copySlot(int64_t from, int64_t to) { digest_[to].copy_(digest_[from]); }

void StateProbe::zeroSlot(int64_t slot) { digest_[slot].zero_(); }

void StateProbe::check(const std::vector<SequenceWrite>& rows, const std::vector<int64_t>& slots,
                       int64_t decodeRows) const {
  std::vector<int64_t> which, checked;
  for (size_t r = 0; r < rows.size(); r++)
    if (int64_t(r) < decodeRows || rows[r].from > 0) {
      which.push_back(int64_t(r));
      checked.push_back(slots[r]);
    }
  if (which.empty()) return;
  // A host read per step: the probe is a test's.
  const at::Tensor held = digest_.index_select(0, at::tensor(checked, kLong).to(digest_.device())).cpu();
  const int64_t* h = held.data_ptr<int64_t>();
  for (size_t i = 0; i < which.size(); i++) {
    const SequenceWrite& w = rows[size_t(which[i])];
    const int64_t want = digestOf(w.seq->tokens, w.from), hash = h[2 * i], count = h[2 * i + 1];
    if (hash != want || count != w.from)
      throw std::logic_error("state probe: sequence " + std::to_string(w.seq->id) + " computes from position " +
                             std::to_string(w.from) + ", yet its slot " + std::to_string(checked[i]) +
                             " holds the state after " + std::to_string(count) + " tokens (hash " +
                             std::to_string(hash) + ", expected " + std::to_string(want) + ")");
  }
}

void StateProbe::update(const at::Tensor& ids, const std::vector<SequenceWrite>& rows,
                        const std::vector<int64_t>& slots, int64_t decodeRows,
                        const std::vector<std::vector<StateSnapshot>>& snapshots) {
  // Outputs: each row's final state into its slot, and each snapshot; each output the digest of
  // its row's first `len` tokens after the row's starting state.
  std::vector<int64_t> tokIdx, coef, outIdx, source, mult, counts, targets;
  int64_t first = 0;
  auto output = [&](size_t r, int64_t len, int64_t target) {
    const SequenceWrite& w = rows[r];
    const int64_t o = int64_t(targets.size());
    for (int64_t j = 0; j < len; j++) {
      tokIdx.push_back(first + j);
      coef.push_back(powMod(len - 1 - j));
      outIdx.push_back(o);
    }
    const bool fromSlot = int64_t(r) < decodeRows || w.from > 0;  // a chunk at position 0 starts from zeros
    source.push_back(fromSlot ? slots[r] : int64_t(digest_.size(0)) - 1);
    mult.push_back(fromSlot ? powMod(len) : 0);
    counts.push_back(w.from + len);
    targets.push_back(target);
  };
  for (size_t r = 0; r < rows.size(); r++) {
    const SequenceWrite& w = rows[r];
    if (int64_t(r) >= decodeRows)
      for (const StateSnapshot& s : snapshots[r - size_t(decodeRows)]) output(r, s.position - w.from, s.slot);
    output(r, w.to - w.from, slots[r]);
    first += w.to - w.from;
  }
  const at::Device dev = digest_.device();
  auto onDev = [&](const std::vector<int64_t>& v) { return at::tensor(v, kLong).to(dev); };
  const at::Tensor old = digest_.index_select(0, onDev(source)).select(1, 0);  // all read before any write
  const at::Tensor contrib = (ids.index_select(0, onDev(tokIdx)) + 1).mul_(onDev(coef)).remainder_(kPrime);
  const at::Tensor sums =
      at::zeros({int64_t(targets.size())}, kLong.device(dev)).index_add_(0, onDev(outIdx), contrib).remainder_(kPrime);
  const at::Tensor hash = (old * onDev(mult)).remainder_(kPrime).add_(sums).remainder_(kPrime);
  digest_.index_copy_(0, onDev(targets), at::stack({hash, onDev(counts)}, 1));
}

}  // namespace prime
