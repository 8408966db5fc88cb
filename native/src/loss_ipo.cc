// ipo: dppo's loss with a symmetric trust region: a token is dropped when |d| > ipo_threshold,
// whatever its advantage's sign (d = exp(logp) - exp(mu)).
#include "loss.h"

namespace prime {

namespace {

LossKind ipoLoss() {
  return {"ipo",
          true,
          {{"ipo_threshold", 0.1, 0, 1, "drop a token whose probability moved by more than this either way"},
           advTauParam(),
           klTauParam()},
          "dppo with a symmetric probability-difference trust region",
          [](const LossContext& c) {
            const at::Tensor d = probabilityDifference(c);
            const double t = c.cfg.param("ipo_threshold");
            return probabilityTrustRegion(c, d<-t, d> t);
          }};
}

const LossRegistration ipoRegistration{ipoLoss()};

}  // namespace

}  // namespace prime
