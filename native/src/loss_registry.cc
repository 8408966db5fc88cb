// The loss registry: one line per loss kind. A new loss is its unit native/src/loss_<name>.cc
// (declared in loss.h), a line here, its case in test/native.rl.test.ts, and then
// `npm run gen:loss-kinds` (after the native build) so the TS side (native/loss-kinds.generated.ts,
// which the config schema derives from) knows it.
#include <stdexcept>

#include "loss.h"

namespace prime {

const std::vector<LossKind>& lossKinds() {
  static const std::vector<LossKind> kinds = {
      ceLoss(), dppoLoss(), ipoLoss(), grpoLoss(), gspoLoss(), cispoLoss(),
  };
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
