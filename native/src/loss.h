// Training objectives on per-token log-probabilities: masked cross-entropy (SFT) and the RL
// policy losses (DPPO, IPO, GRPO/PPO-clip, GSPO, CISPO) with trainer/inference mismatch
// correction (TIS, masking) and an optional k3 KL penalty to a reference policy. ATen only, so
// the trainer and the addon's pure test hook run exactly the same code.
//
// A step's loss has up to two components, each normalised by its own count over the whole step
// (as prime-rl's rl and ce components): the configured kind over the loss-masked tokens, and,
// where rows carry cross-entropy weights (echo's observation tokens, an sft-distilled teacher's
// tokens), the registry's `ce` kind over the tokens whose weight is above 0, times the weight,
// divided by the step's such tokens. A token may be in both.
//
// Each loss kind is one unit (native/src/loss_<name>.cc) that registers itself in the registry
// (loss_registry.cc) with a LossRegistration: its name, whether it is a policy loss, its
// parameters (name = the config key under trainer.loss, default, range) and its per-token terms.
// The registry is the source of truth for loss names and parameters: the addon exports it
// (lossKinds()) and the TS side derives its types and config schema from it
// (native/loss-kinds.generated.ts, checked by a test).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "metrics.h"

namespace prime {

struct LossConfig {
  std::string kind = "ce";              // a registry name (lossKinds())
  double temperature = 1.0;             // logits / T before log-softmax, to match inference logprobs
  std::string normalization = "token";  // token | sequence
  // Denominator of the step's loss: loss tokens (token) or samples (sequence) of the whole
  // optimizer step, for steps split over several calls. 0 = count them over this call's rows.
  double normalizer = 0;
  // Denominator of the cross-entropy component: the step's tokens with a ce weight above 0 (as
  // normalizer); 0 = count them over this call's rows.
  double ceNormalizer = 0;
  // The kind's parameters by name; an absent one takes the registry default (param()).
  std::map<std::string, double> params;
  std::string mismatch = "none";             // none | tis | mask: correction on the detached ratio
  double tisCap = 2.0;                       // tis: token loss times min(ratio, tisCap)
  double tokenLow = 0.125, tokenHigh = 8.0;  // mask: keep tokens with ratio in [low, high]
  double seqLow = 0.1, seqHigh = 10.0;       // mask: keep samples whose geometric-mean ratio is inside
  double klBeta = 0;                         // weight of the k3 KL to the reference policy
  double routerAuxLossCoef = 0;              // MoE: weight of the router's load-balancing loss (trainer.cc)
  bool isPolicy() const;
  // Parameter `name` of this kind: the configured value or the registry default.
  double param(const std::string& name) const;
};

// Checks kinds, parameters, modes and ranges; throws with the offending field named.
void validateLossConfig(const LossConfig& cfg);

// One row's loss tokens, flattened: index j is one predicted token. All tensors [T] in one
// floating dtype. logp carries the autograd graph; the others are data.
struct LossInputs {
  at::Tensor logp;      // trainer log pi_theta(token) under softmax(logits / T)
  at::Tensor mask;      // 1 = loss token
  at::Tensor mu;        // inference (behaviour) logprobs; policy losses only
  at::Tensor adv;       // advantages; policy losses only
  at::Tensor refLogp;   // reference-policy logprobs; only when klBeta > 0
  at::Tensor entropy;   // optional, detached: for the entropy metric
  at::Tensor ceWeight;  // optional: each token's cross-entropy weight (0 = none), beside the policy loss
  at::Tensor sample;    // int64 sample index in [0, numSamples) of each token
  int64_t numSamples = 0;
};

// What a loss kind's terms see: the inputs plus the quantities most kinds share.
struct LossContext {
  const LossConfig& cfg;
  const LossInputs& in;
  at::Tensor logRatio;     // (logp - mu) * mask, with grad (0 off the loss tokens; policy kinds only)
  at::Tensor rho;          // exp(logRatio), detached
  at::Tensor seqLogRatio;  // per sample: mean of logRatio over its loss tokens, with grad
  at::Tensor nSafe;        // per sample: loss tokens, at least 1
  // Per-sample sums of a per-token tensor (differentiable).
  at::Tensor sampleSum(const at::Tensor& x) const;
};

// A kind's per-token loss (before the mismatch weight and the normalisation) and its own masks.
struct LossTerms {
  at::Tensor perToken;
  at::Tensor clipped;            // bool, optional: tokens where a clip was active (metric)
  at::Tensor dropLow, dropHigh;  // bool, optional: tokens the kind's trust region dropped, per side
  // Optional: a per-token penalty toward the inference policy (dppo's and ipo's kl_tau term),
  // added on every loss token without the mismatch weight, as prime-rl adds it outside its masks.
  at::Tensor regularizer;
};

struct LossParam {
  std::string name;  // the config key under trainer.loss
  double dflt;
  double min = 0, max = std::numeric_limits<double>::infinity();  // inclusive
  std::string doc;
};

struct LossKind {
  std::string name;
  bool policy;  // needs advantages and inference logprobs
  std::vector<LossParam> params;
  std::string doc;
  std::function<LossTerms(const LossContext&)> terms;
};

// The registry, sorted by name; lossKind throws naming the supported kinds.
const std::vector<LossKind>& lossKinds();
const LossKind& lossKind(const std::string& name);

// A unit registers its kind when the addon loads, at namespace scope in its own file:
//   namespace { const LossRegistration nameRegistration{LossKind{"name", ...}}; }
// (named after the loss: the build may compile several units as one, see CMakeLists.txt)
// so a new loss is its file alone (CMake globs src/*.cc). Two kinds with one name are an error
// on the first use of the registry.
struct LossRegistration {
  explicit LossRegistration(LossKind kind);
};

// Pieces shared by several units (defined in the first unit that uses them).
LossParam epsLowParam();   // loss_grpo.cc
LossParam epsHighParam();  // loss_grpo.cc
LossParam advTauParam();   // loss_dppo.cc
LossParam klTauParam();    // loss_dppo.cc
// dppo's and ipo's terms given which loss tokens their trust region drops (bool, detached).
LossTerms probabilityTrustRegion(const LossContext& c, const at::Tensor& dropLow, const at::Tensor& dropHigh);
// exp(logp) - exp(mu) on the loss tokens (0 elsewhere, whatever mu holds there); no gradient.
at::Tensor probabilityDifference(const LossContext& c);

// Sums over the loss tokens / samples of everything seen so far in a step (metrics are these
// divided by lossTokens or samples at the end). A masked token is a loss token whose policy
// term was dropped, by the mismatch mask or by the kind's own trust region.
struct LossSums {
  double loss = 0;  // already normalised: the step loss is the plain sum over rows
  double entropy = 0, mismatchKl = 0, maskedMismatchKl = 0, referenceKl = 0;
  double ceLoss = 0, ceNll = 0;  // the ce component (normalised, in loss) and its tokens' -logp (a sum)
  int64_t lossTokens = 0, samples = 0, maskedTokens = 0, maskedSamples = 0, clippedTokens = 0;
  int64_t maskedLow = 0, maskedHigh = 0, maskedAdvPositive = 0, maskedAdvNegative = 0;
  int64_t ceTokens = 0;
};

// The step's metrics (loss.cc says what each one is): the sums turned into means over loss
// tokens, fractions of samples or of masked tokens.
Metrics lossMetrics(const LossSums& sums);

// LossSums accumulated on the loss's device: each addition is a device op, never a host sync (the
// trainer's per-row loop on CUDA); read() brings them to the host, once per step.
class DeviceLossSums {
 public:
  enum Real { kLoss, kEntropy, kMismatchKl, kMaskedMismatchKl, kReferenceKl, kCeLoss, kCeNll, kNumReals };
  enum Count {
    kLossTokens,
    kSamples,
    kMaskedTokens,
    kMaskedSamples,
    kClippedTokens,
    kMaskedLow,
    kMaskedHigh,
    kMaskedAdvPositive,
    kMaskedAdvNegative,
    kCeTokens,
    kNumCounts
  };
  void add(Real which, const at::Tensor& x);          // += the sum of x (detached, fp64)
  void count(Count which, const at::Tensor& isTrue);  // += the number of true elements
  LossSums read() const;                              // one device-to-host copy

 private:
  void on(const at::Device& device);
  at::Tensor reals_, counts_;
};

// Loss tokens and samples (with at least one loss token) in the inputs: the normaliser parts.
void countLossUnits(const at::Tensor& mask, const at::Tensor& sample, int64_t numSamples, int64_t& lossTokens,
                    int64_t& samples);
// cfg.normalizer, or else the count of the normalisation unit given (at least 1).
double resolveNormalizer(const LossConfig& cfg, int64_t lossTokens, int64_t samples);
// cfg.ceNormalizer, or else the tokens with a ce weight given (at least 1).
double resolveCeNormalizer(const LossConfig& cfg, int64_t ceTokens);

// This row's share of the step loss (differentiable w.r.t. in.logp): the policy component divided
// by `normalizer` (loss tokens or samples of the whole step, per cfg.normalization), plus, with
// in.ceWeight, the ce component divided by `ceNormalizer` (the step's ce-weighted tokens). Adds
// the row's metric sums to `sums`, on the device.
at::Tensor policyLoss(const LossConfig& cfg, const LossInputs& in, double normalizer, DeviceLossSums& sums,
                      double ceNormalizer = 1);

}  // namespace prime
