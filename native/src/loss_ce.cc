// ce: -logp on every loss token (SFT).
#include "loss.h"

namespace prime {

namespace {

LossKind ceLoss() {
  return {"ce", false, {}, "cross-entropy -logp (SFT)", [](const LossContext& c) { return LossTerms{-c.in.logp}; }};
}

const LossRegistration ceRegistration{ceLoss()};

}  // namespace

}  // namespace prime
