#include "loss.h"

#include <algorithm>
#include <stdexcept>

namespace prime {

void validateLossConfig(const LossConfig& c) {
  if (c.kind != "ce" && c.kind != "grpo" && c.kind != "gspo" && c.kind != "cispo")
    throw std::runtime_error("unknown loss kind '" + c.kind + "' (supported: ce, grpo, gspo, cispo)");
  if (!(c.temperature > 0)) throw std::runtime_error("loss temperature must be > 0");
  if (c.normalization != "token" && c.normalization != "sequence")
    throw std::runtime_error("unknown loss normalization '" + c.normalization + "' (supported: token, sequence)");
  if (!(c.normalizer >= 0)) throw std::runtime_error("loss normalizer must be >= 0");
  if (!(c.epsLow >= 0 && c.epsLow <= 1) || !(c.epsHigh >= 0))
    throw std::runtime_error("loss epsLow must be in [0, 1] and epsHigh >= 0");
  if (c.mismatch != "none" && c.mismatch != "tis" && c.mismatch != "mask")
    throw std::runtime_error("unknown mismatch correction '" + c.mismatch + "' (supported: none, tis, mask)");
  if (c.mismatch != "none" && !c.isPolicy())
    throw std::runtime_error("mismatch correction needs inference logprobs: use it with grpo, gspo or cispo");
  if (!(c.tisCap > 0)) throw std::runtime_error("tisCap must be > 0");
  if (!(c.tokenLow >= 0 && c.tokenLow <= c.tokenHigh) || !(c.seqLow >= 0 && c.seqLow <= c.seqHigh))
    throw std::runtime_error("mask bounds need 0 <= tokenLow <= tokenHigh and 0 <= seqLow <= seqHigh");
  if (!(c.klBeta >= 0)) throw std::runtime_error("klBeta must be >= 0");
}

namespace {
// Per-sample sums of a per-token tensor (differentiable).
at::Tensor sampleSum(const LossInputs& in, const at::Tensor& x) {
  return at::zeros({in.numSamples}, x.options()).index_add(0, in.sample, x);
}
int64_t count(const at::Tensor& b) { return b.sum().item<int64_t>(); }
double total(const at::Tensor& x) { return x.sum().item<double>(); }
}  // namespace

void countLossUnits(const at::Tensor& mask, const at::Tensor& sample, int64_t numSamples, int64_t& lossTokens,
                    int64_t& samples) {
  lossTokens = count(mask > 0);
  samples = count(at::zeros({numSamples}, mask.options()).index_add(0, sample, mask) > 0);
}

double resolveNormalizer(const LossConfig& cfg, int64_t lossTokens, int64_t samples) {
  if (cfg.normalizer > 0) return cfg.normalizer;
  return double(std::max<int64_t>(cfg.normalization == "token" ? lossTokens : samples, 1));
}

LossMetrics lossMetrics(const LossSums& s) {
  LossMetrics m;
  const double tokens = double(std::max<int64_t>(s.lossTokens, 1));
  m.loss = s.loss;
  m.lossTokens = s.lossTokens;
  m.samples = s.samples;
  m.entropy = s.entropy / tokens;
  m.mismatchKl = s.mismatchKl / tokens;
  m.referenceKl = s.referenceKl / tokens;
  m.maskedTokenFraction = double(s.maskedTokens) / tokens;
  m.clippedFraction = double(s.clippedTokens) / tokens;
  m.maskedSampleFraction = double(s.maskedSamples) / double(std::max<int64_t>(s.samples, 1));
  return m;
}

at::Tensor policyLoss(const LossConfig& cfg, const LossInputs& in, double normalizer, LossSums& sums) {
  const at::Tensor& m = in.mask;
  const at::Tensor isLoss = m > 0;
  const at::Tensor n = sampleSum(in, m);  // loss tokens per sample
  const at::Tensor nSafe = n.clamp_min(1);
  int64_t lossTokens, samples;
  countLossUnits(m, in.sample, in.numSamples, lossTokens, samples);
  sums.lossTokens += lossTokens;
  sums.samples += samples;

  at::Tensor perToken;   // loss of each token before mismatch weighting
  at::Tensor weight = m; // detached: mask times the mismatch correction
  if (!cfg.isPolicy()) {
    perToken = -in.logp;
  } else {
    // Multiplying by the mask zeroes the ratio's log off the loss tokens, so whatever the
    // caller put there (0 per the row format) can never overflow exp().
    const at::Tensor logRatio = (in.logp - in.mu) * m;
    const at::Tensor lrDetached = logRatio.detach(), rho = lrDetached.exp();
    const at::Tensor seqLogRatio = sampleSum(in, logRatio) / nSafe;  // log geometric-mean ratio, with grad
    sums.mismatchKl += total((rho - lrDetached - 1) * m);
    if (cfg.mismatch == "tis") {
      weight = weight * rho.clamp_max(cfg.tisCap);
    } else if (cfg.mismatch == "mask") {
      const at::Tensor seqRho = seqLogRatio.detach().exp();
      const at::Tensor keepSeq = (seqRho >= cfg.seqLow) & (seqRho <= cfg.seqHigh);
      const at::Tensor keepTok = (rho >= cfg.tokenLow) & (rho <= cfg.tokenHigh) & keepSeq.index_select(0, in.sample);
      weight = weight * keepTok.to(m.scalar_type());
      sums.maskedSamples += count((n > 0) & keepSeq.logical_not());
    }
    const at::Tensor& A = in.adv;
    const double lo = 1 - cfg.epsLow, hi = 1 + cfg.epsHigh;
    at::Tensor clipped;
    if (cfg.kind == "grpo") {
      // -min(r A, clip(r) A): the clipped branch wins exactly when A > 0 and r > hi or A < 0 and
      // r < lo, and is then a constant. Selecting explicitly gives PPO's gradient without relying
      // on how autograd splits min() at ties (r inside the range makes both branches equal).
      const at::Tensor r = logRatio.exp(), rd = r.detach();
      clipped = ((A > 0) & (rd > hi)) | ((A < 0) & (rd < lo));
      perToken = -A * at::where(clipped, rd.clamp(lo, hi), r);
    } else if (cfg.kind == "cispo") {
      clipped = rho > hi;
      perToken = -(rho.clamp_max(hi) * A) * in.logp;
    } else {
      // gspo: one term per sample on the sequence ratio, copied onto each of its loss tokens: the
      // token normalisation then weights it by its token count, and each copy takes its own
      // token's mismatch weight (a masked token removes its share of the sample's term).
      const at::Tensor s = seqLogRatio.exp(), sd = s.detach();
      const at::Tensor Aseq = sampleSum(in, A * m) / nSafe;
      const at::Tensor clippedSeq = ((Aseq > 0) & (sd > hi)) | ((Aseq < 0) & (sd < lo));
      perToken = (-Aseq * at::where(clippedSeq, sd.clamp(lo, hi), s)).index_select(0, in.sample);
      clipped = clippedSeq.index_select(0, in.sample);
    }
    sums.clippedTokens += count(clipped & isLoss);
  }
  sums.maskedTokens += count(isLoss & (weight == 0));

  at::Tensor tokenLoss = perToken * weight;
  if (cfg.klBeta > 0) {
    // k3 estimator of KL(pi_theta || pi_ref), on every loss token (mismatch masking is about
    // the behaviour policy, not the reference). Masked before exp() for the same reason as above.
    const at::Tensor d = (in.refLogp - in.logp) * m;
    const at::Tensor k3 = d.exp() - d - 1;
    tokenLoss = tokenLoss + cfg.klBeta * k3;
    sums.referenceKl += total(k3.detach());
  }
  if (in.entropy.defined()) sums.entropy += total(in.entropy * m);
  at::Tensor loss = cfg.normalization == "token" ? tokenLoss.sum() : (sampleSum(in, tokenLoss) / nSafe).sum();
  loss = loss / normalizer;
  sums.loss += loss.item<double>();
  return loss;
}

}  // namespace prime
