// cispo: -sg(min(r, 1 + eps_high)) A logp (clipped IS weight, REINFORCE-style gradient).
#include "loss.h"

namespace prime {

namespace {

LossKind cispoLoss() {
  return {"cispo", true, {epsHighParam()}, "clipped IS-weight REINFORCE", [](const LossContext& c) {
            const double hi = 1 + c.cfg.param("eps_high");
            return LossTerms{-(c.rho.clamp_max(hi) * c.in.adv) * c.in.logp, c.rho > hi};
          }};
}

const LossRegistration cispoRegistration{cispoLoss()};

}  // namespace

}  // namespace prime
