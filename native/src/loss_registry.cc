// The loss registry: one line per loss kind (its unit is native/src/loss_<name>.cc). The TS side
// derives from this list (native/loss-kinds.generated.ts; regenerate with
// `npx tsx scripts/gen-loss-kinds.ts` after a change here).
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
