#include "loss.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace prime {

bool LossConfig::isPolicy() const { return lossKind(kind).policy; }

double LossConfig::param(const std::string& name) const {
  auto it = params.find(name);
  if (it != params.end()) return it->second;
  for (const LossParam& p : lossKind(kind).params)
    if (p.name == name) return p.dflt;
  throw std::runtime_error("loss '" + kind + "' has no parameter '" + name + "'");
}

void validateLossConfig(const LossConfig& c) {
  const LossKind& k = lossKind(c.kind);
  for (const auto& [name, value] : c.params) {
    auto p = std::find_if(k.params.begin(), k.params.end(), [&](const LossParam& q) { return q.name == name; });
    if (p == k.params.end()) {
      std::string known;
      for (const LossParam& q : k.params) known += (known.empty() ? "" : ", ") + q.name;
      throw std::runtime_error("loss '" + c.kind + "' has no parameter '" + name +
                               "' (its parameters: " + (known.empty() ? "none" : known) + ")");
    }
    if (!(value >= p->min && value <= p->max)) {
      std::ostringstream os;
      os << "loss parameter " << name << " = " << value << " is outside [" << p->min << ", " << p->max << "]";
      throw std::runtime_error(os.str());
    }
  }
  if (!(c.temperature > 0)) throw std::runtime_error("loss temperature must be > 0");
  if (!(c.normalizer >= 0)) throw std::runtime_error("loss normalizer must be >= 0");
  if (!(c.ceNormalizer >= 0)) throw std::runtime_error("loss ceNormalizer must be >= 0");
  if (c.mismatch != MismatchMode::kNone && !k.policy)
    throw std::runtime_error("mismatch correction needs inference logprobs: use it with a policy loss, not '" + c.kind +
                             "'");
  if (!(c.tisCap > 0)) throw std::runtime_error("tisCap must be > 0");
  if (!(c.tokenLow >= 0 && c.tokenLow <= c.tokenHigh) || !(c.seqLow >= 0 && c.seqLow <= c.seqHigh))
    throw std::runtime_error("mask bounds need 0 <= tokenLow <= tokenHigh and 0 <= seqLow <= seqHigh");
  if (!(c.klBeta >= 0)) throw std::runtime_error("klBeta must be >= 0");
}

at::Tensor LossContext::sampleSum(const at::Tensor& x) const {
  return at::zeros({in.numSamples}, x.options()).index_add(0, in.sample, x);
}

namespace {
int64_t count(const at::Tensor& b) { return b.sum().item<int64_t>(); }
}  // namespace

void DeviceLossSums::on(const at::Device& device) {
  if (reals_.defined()) return;
  reals_ = at::zeros({kNumReals}, at::TensorOptions().dtype(at::kDouble).device(device));
  counts_ = at::zeros({kNumCounts}, at::TensorOptions().dtype(at::kLong).device(device));
}

void DeviceLossSums::add(Real which, const at::Tensor& x) {
  on(x.device());
  reals_.select(0, which).add_(x.detach().sum(at::kDouble));
}

void DeviceLossSums::count(Count which, const at::Tensor& isTrue) {
  on(isTrue.device());
  counts_.select(0, which).add_(isTrue.sum());
}

LossSums DeviceLossSums::read() const {
  LossSums s;
  if (!reals_.defined()) return s;
  // One copy (counts are exact in fp64 up to 2^53); the step's deliberate sync.
  const at::Tensor h = at::cat({reals_, counts_.to(at::kDouble)}).cpu();
  const double* v = h.data_ptr<double>();
  const double* n = v + kNumReals;
  s.loss = v[kLoss], s.entropy = v[kEntropy], s.mismatchKl = v[kMismatchKl];
  s.maskedMismatchKl = v[kMaskedMismatchKl], s.referenceKl = v[kReferenceKl];
  s.ceLoss = v[kCeLoss], s.ceNll = v[kCeNll], s.ceTokens = int64_t(n[kCeTokens]);
  s.lossTokens = int64_t(n[kLossTokens]), s.samples = int64_t(n[kSamples]);
  s.maskedTokens = int64_t(n[kMaskedTokens]), s.maskedSamples = int64_t(n[kMaskedSamples]);
  s.clippedTokens = int64_t(n[kClippedTokens]), s.maskedLow = int64_t(n[kMaskedLow]);
  s.maskedHigh = int64_t(n[kMaskedHigh]), s.maskedAdvPositive = int64_t(n[kMaskedAdvPositive]);
  s.maskedAdvNegative = int64_t(n[kMaskedAdvNegative]);
  return s;
}

void countLossUnits(const at::Tensor& mask, const at::Tensor& sample, int64_t numSamples, int64_t& lossTokens,
                    int64_t& samples) {
  lossTokens = count(mask > 0);
  samples = count(at::zeros({numSamples}, mask.options()).index_add(0, sample, mask) > 0);
}

double resolveNormalizer(const LossConfig& cfg, int64_t lossTokens, int64_t samples) {
  if (cfg.normalizer > 0) return cfg.normalizer;
  return double(std::max<int64_t>(cfg.normalization == LossNormalization::kToken ? lossTokens : samples, 1));
}

double resolveCeNormalizer(const LossConfig& cfg, int64_t ceTokens) {
  if (cfg.ceNormalizer > 0) return cfg.ceNormalizer;
  return double(std::max<int64_t>(ceTokens, 1));
}

Metrics lossMetrics(const LossSums& s) {
  Metrics m;
  const double tokens = double(std::max<int64_t>(s.lossTokens, 1));
  const double masked = double(std::max<int64_t>(s.maskedTokens, 1));
  const double kept = double(std::max<int64_t>(s.lossTokens - s.maskedTokens, 1));
  m.set("loss", s.loss);
  // Mean entropy of softmax(logits / temperature) (0 from the addon's policyLoss, which has no logits).
  m.set("entropy", s.entropy / tokens);
  // Mean of rho - log rho - 1, rho = exp(logp - mu) (detached): the trainer/inference mismatch;
  // its mean over the masked tokens and over the others (0 when there are none).
  m.set("mismatch_kl", s.mismatchKl / tokens);
  m.set("mismatch_kl_masked", s.maskedMismatchKl / masked);
  m.set("mismatch_kl_unmasked", (s.mismatchKl - s.maskedMismatchKl) / kept);
  // Loss tokens whose policy term was dropped, by mismatch masking (token or sample rule) or by the
  // loss's own trust region (dppo, ipo); those dropped for a ratio / probability that fell too far
  // (low) or rose too far (high); tokens dropped only by the sample rule are on neither side.
  m.set("masked_tokens", double(s.maskedTokens) / tokens);
  m.set("masked_low", double(s.maskedLow) / tokens);
  m.set("masked_high", double(s.maskedHigh) / tokens);
  // Of the masked tokens, the fractions with a positive and a negative advantage.
  m.set("masked_adv_positive", double(s.maskedAdvPositive) / masked);
  m.set("masked_adv_negative", double(s.maskedAdvNegative) / masked);
  // Samples dropped by the sample rule of mismatch masking.
  m.set("masked_sequences", double(s.maskedSamples) / double(std::max<int64_t>(s.samples, 1)));
  // Loss tokens where the clip was active (gspo: tokens of clipped samples).
  m.set("clipped", double(s.clippedTokens) / tokens);
  // Mean k3 KL to the reference policy (0 without klBeta).
  m.set("kl_divergence", s.referenceKl / tokens);
  // Loss tokens, and samples with at least one: the normaliser's units.
  m.set("loss_tokens", double(s.lossTokens));
  m.set("loss_samples", double(s.samples));
  // The cross-entropy component (echo, sft distillation): its share of the loss, the mean -logp
  // of its tokens, and their count (all 0 without one).
  m.set("ce_loss", s.ceLoss);
  m.set("ce_nll", s.ceNll / double(std::max<int64_t>(s.ceTokens, 1)));
  m.set("ce_tokens", double(s.ceTokens));
  return m;
}

at::Tensor policyLoss(const LossConfig& cfg, const LossInputs& in, double normalizer, DeviceLossSums& sums,
                      double ceNormalizer) {
  using S = DeviceLossSums;
  const LossKind& kind = lossKind(cfg.kind);
  const at::Tensor& m = in.mask;
  const at::Tensor isLoss = m > 0;
  LossContext ctx{cfg, in, {}, {}, {}, {}};
  const at::Tensor n = ctx.sampleSum(m);  // loss tokens per sample
  sums.count(S::kLossTokens, isLoss);
  sums.count(S::kSamples, n > 0);
  ctx.nSafe = n.clamp_min(1);
  at::Tensor weight = m;  // detached: mask times the mismatch correction
  at::Tensor low = at::zeros_like(isLoss), high = at::zeros_like(isLoss);  // masked, per side
  at::Tensor tokenMismatchKl;
  if (kind.policy) {
    // Multiplying by the mask zeroes the ratio's log off the loss tokens, so whatever the
    // caller put there (0 per the row format) can never overflow exp().
    ctx.logRatio = (in.logp - in.mu) * m;
    const at::Tensor lrDetached = ctx.logRatio.detach();
    ctx.rho = lrDetached.exp();
    ctx.seqLogRatio = ctx.sampleSum(ctx.logRatio) / ctx.nSafe;  // log geometric-mean ratio, with grad
    tokenMismatchKl = (ctx.rho - lrDetached - 1) * m;
    sums.add(S::kMismatchKl, tokenMismatchKl);
    if (cfg.mismatch == MismatchMode::kTis) {
      weight = weight * ctx.rho.clamp_max(cfg.tisCap);
    } else if (cfg.mismatch == MismatchMode::kMask) {
      const at::Tensor seqRho = ctx.seqLogRatio.detach().exp();
      const at::Tensor keepSeq = (seqRho >= cfg.seqLow) & (seqRho <= cfg.seqHigh);
      const at::Tensor keepTok =
          (ctx.rho >= cfg.tokenLow) & (ctx.rho <= cfg.tokenHigh) & keepSeq.index_select(0, in.sample);
      weight = weight * keepTok.to(m.scalar_type());
      low = low | (ctx.rho < cfg.tokenLow);
      high = high | (ctx.rho > cfg.tokenHigh);
      sums.count(S::kMaskedSamples, (n > 0) & keepSeq.logical_not());
    }
  }
  const LossTerms terms = kind.terms(ctx);
  if (terms.clipped.defined()) sums.count(S::kClippedTokens, terms.clipped & isLoss);
  if (terms.dropLow.defined()) low = low | terms.dropLow;
  if (terms.dropHigh.defined()) high = high | terms.dropHigh;
  const at::Tensor masked = isLoss & ((weight == 0) | low | high);
  sums.count(S::kMaskedTokens, masked);
  sums.count(S::kMaskedLow, isLoss & low);
  sums.count(S::kMaskedHigh, isLoss & high);
  if (kind.policy) {
    sums.add(S::kMaskedMismatchKl, tokenMismatchKl * masked);
    sums.count(S::kMaskedAdvPositive, masked & (in.adv > 0));
    sums.count(S::kMaskedAdvNegative, masked & (in.adv < 0));
  }

  at::Tensor tokenLoss = terms.perToken * weight;
  // The mismatch weight corrects the policy term's off-policy estimate; a penalty toward the
  // inference policy stays on every loss token (most needed where the ratio is furthest from 1).
  if (terms.regularizer.defined()) tokenLoss = tokenLoss + terms.regularizer * m;
  if (cfg.klBeta > 0) {
    // k3 estimator of KL(pi_theta || pi_ref), on every loss token (mismatch masking is about
    // the behaviour policy, not the reference). Masked before exp() for the same reason as above.
    const at::Tensor d = (in.refLogp - in.logp) * m;
    const at::Tensor k3 = d.exp() - d - 1;
    tokenLoss = tokenLoss + cfg.klBeta * k3;
    sums.add(S::kReferenceKl, k3);
  }
  if (in.entropy.defined()) sums.add(S::kEntropy, in.entropy * m);
  at::Tensor loss =
      cfg.normalization == LossNormalization::kToken ? tokenLoss.sum() : (ctx.sampleSum(tokenLoss) / ctx.nSafe).sum();
  loss = loss / normalizer;
  if (in.ceWeight.defined()) {
    // The ce component: the registry's `ce` unit on every token, times its weight (0 off its tokens).
    const at::Tensor nll = lossKind("ce").terms(ctx).perToken;
    const at::Tensor isCe = in.ceWeight > 0;
    const at::Tensor ce = (nll * in.ceWeight).sum() / ceNormalizer;
    sums.add(S::kCeLoss, ce);
    sums.add(S::kCeNll, nll * isCe.to(nll.scalar_type()));
    sums.count(S::kCeTokens, isCe);
    loss = loss + ce;
  }
  sums.add(S::kLoss, loss);
  return loss;
}

}  // namespace prime
