// gspo: PPO's clip on the sequence ratio s = exp(mean log r over the sample's loss tokens).
#include "loss.h"

namespace prime {

namespace {

LossKind gspoLoss() {
  return {"gspo", true, {epsLowParam(), epsHighParam()}, "PPO clip on the sequence ratio", [](const LossContext& c) {
            // One term per sample, copied onto each of its loss tokens: the token normalisation
            // then weights it by its token count, and each copy takes its own token's mismatch
            // weight (a masked token removes its share of the sample's term).
            const double lo = 1 - c.cfg.param("eps_low"), hi = 1 + c.cfg.param("eps_high");
            const at::Tensor s = c.seqLogRatio.exp(), sd = s.detach();
            const at::Tensor Aseq = c.sampleSum(c.in.adv * c.in.mask) / c.nSafe;
            const at::Tensor clippedSeq = ((Aseq > 0) & (sd > hi)) | ((Aseq < 0) & (sd < lo));
            const at::Tensor perSample = -Aseq * at::where(clippedSeq, sd.clamp(lo, hi), s);
            return LossTerms{perSample.index_select(0, c.in.sample), clippedSeq.index_select(0, c.in.sample)};
          }};
}

const LossRegistration gspoRegistration{gspoLoss()};

}  // namespace

}  // namespace prime
