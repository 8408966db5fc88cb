// dppo: prime-rl's default "DPPO + KL". A trust region on the probability difference
// d = exp(logp) - exp(mu) (not the ratio): a token is dropped when A > 0 and d > dppo_mask_high
// (raised too far) or A <= 0 and d < -dppo_mask_low (lowered too far). Per loss token:
//   -keep * adv_tau * A * r + kl_tau * (log r)^2,   r = exp(logp - mu),
// the gradient flowing through r and through the KL term on every loss token, dropped or not
// (by the trust region or by trainer.loss.mismatch: the KL term is the regularizer of LossTerms).
#include "loss.h"

namespace prime {

LossParam advTauParam() {
  return {"adv_tau", 1.0, 0, std::numeric_limits<double>::infinity(), "weight of the advantage term"};
}
LossParam klTauParam() {
  return {"kl_tau", 1e-3, 0, std::numeric_limits<double>::infinity(),
          "weight of the (log ratio)^2 term to the inference policy"};
}

LossTerms probabilityTrustRegion(const LossContext& c, const at::Tensor& dropLow, const at::Tensor& dropHigh) {
  const at::Tensor keep = (dropLow | dropHigh).logical_not().to(c.in.mask.scalar_type());
  const at::Tensor r = c.logRatio.exp();
  const at::Tensor policy = -keep * c.cfg.param("adv_tau") * c.in.adv * r;
  return LossTerms{policy, {}, dropLow, dropHigh, c.cfg.param("kl_tau") * c.logRatio.square()};
}

at::Tensor probabilityDifference(const LossContext& c) {
  const at::Tensor d = c.in.logp.detach().exp() - c.in.mu.exp();
  return at::where(c.in.mask > 0, d, at::zeros_like(d));
}

namespace {

LossKind dppoLoss() {
  return {"dppo",
          true,
          {{"dppo_mask_low", 0.2, 0, 1, "drop a token with advantage <= 0 whose probability fell by more than this"},
           {"dppo_mask_high", 0.2, 0, 1, "drop a token with advantage > 0 whose probability rose by more than this"},
           advTauParam(),
           klTauParam()},
          "DPPO + KL (prime-rl's default): probability-difference trust region",
          [](const LossContext& c) {
            const at::Tensor d = probabilityDifference(c), pos = c.in.adv > 0;
            return probabilityTrustRegion(c, pos.logical_not() & (d < -c.cfg.param("dppo_mask_low")),
                                          pos & (d > c.cfg.param("dppo_mask_high")));
          }};
}

const LossRegistration dppoRegistration{dppoLoss()};

}  // namespace

}  // namespace prime
