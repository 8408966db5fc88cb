// grpo: PPO's clipped surrogate on the token ratio r, -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A).
#include "loss.h"

namespace prime {

LossParam epsLowParam() { return {"eps_low", 0.2, 0, 1, "lower clip range of the importance ratio"}; }
LossParam epsHighParam() {
  return {"eps_high", 0.28, 0, std::numeric_limits<double>::infinity(),
          "upper clip range of the importance ratio (DAPO clip-higher)"};
}

namespace {

LossKind grpoLoss() {
  return {"grpo", true, {epsLowParam(), epsHighParam()}, "PPO clip on the token ratio", [](const LossContext& c) {
            const at::Tensor& A = c.in.adv;
            const double lo = 1 - c.cfg.param("eps_low"), hi = 1 + c.cfg.param("eps_high");
            // -min(r A, clip(r) A): the clipped branch wins exactly when A > 0 and r > hi or A < 0
            // and r < lo, and is then a constant. Selecting explicitly gives PPO's gradient without
            // relying on how autograd splits min() at ties (inside the range both are equal).
            const at::Tensor r = c.logRatio.exp(), rd = r.detach();
            const at::Tensor clipped = ((A > 0) & (rd > hi)) | ((A < 0) & (rd < lo));
            return LossTerms{-A * at::where(clipped, rd.clamp(lo, hi), r), clipped};
          }};
}

const LossRegistration grpoRegistration{grpoLoss()};

}  // namespace

}  // namespace prime
