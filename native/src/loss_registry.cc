// The loss registry: the kinds the units (native/src/loss_<name>.cc) register at load. A new
// loss is its unit, which registers itself (loss.h), and its case in test/native.rl.test.ts's
// reference; then `npm run gen:loss-kinds` (after the native build) rewrites the TS copy
// (native/loss-kinds.generated.ts, which the config schema derives from).
#include <algorithm>
#include <stdexcept>

#include "loss.h"

namespace prime {

namespace {
// Filled during static initialisation, in whatever order the units load: a function-local
// static, so it exists before the first registration.
std::vector<LossKind>& registered() {
  static std::vector<LossKind> kinds;
  return kinds;
}
}  // namespace

LossRegistration::LossRegistration(LossKind kind) { registered().push_back(std::move(kind)); }

const std::vector<LossKind>& lossKinds() {
  // First called after the addon has loaded, so every unit has registered. Sorted by name so the
  // order does not depend on link order.
  static const std::vector<LossKind> kinds = [] {
    std::vector<LossKind> k = registered();
    std::sort(k.begin(), k.end(), [](const LossKind& a, const LossKind& b) { return a.name < b.name; });
    for (size_t i = 1; i < k.size(); i++)
      if (k[i].name == k[i - 1].name) throw std::runtime_error("loss kind '" + k[i].name + "' is registered twice");
    return k;
  }();
  return kinds;
}

const LossKind& lossKind(const std::string& name) {
  std::string known;
  for (const LossKind& k : lossKinds()) {
    if (k.name == name) return k;
    known += (known.empty() ? "" : ", ") + k.name;
  }
  throw std::runtime_error("unknown loss kind '" + name + "' (supported: " + known + ")");
}

}  // namespace prime
