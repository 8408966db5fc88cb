// Training objectives on per-token log-probabilities: masked cross-entropy (SFT) and the RL
// policy losses of prime-rl (GRPO/PPO-clip, GSPO, CISPO) with trainer/inference mismatch
// correction (TIS, masking) and an optional k3 KL penalty to a reference policy. ATen only, so
// the trainer and the addon's pure test hook run exactly the same code.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace prime {

struct LossConfig {
  std::string kind = "ce";             // ce | grpo | gspo | cispo
  double temperature = 1.0;            // logits / T before log-softmax, to match inference logprobs
  std::string normalization = "token"; // token | sequence
  // Denominator of the step's loss: loss tokens (token) or samples (sequence) of the whole
  // optimizer step, for steps split over several calls. 0 = count them over this call's rows.
  double normalizer = 0;
  double epsLow = 0.2, epsHigh = 0.2;  // clip range [1 - epsLow, 1 + epsHigh] (cispo: epsHigh only)
  std::string mismatch = "none";       // none | tis | mask: correction on the detached ratio
  double tisCap = 2.0;                 // tis: token loss times min(ratio, tisCap)
  double tokenLow = 0.125, tokenHigh = 8.0;  // mask: keep tokens with ratio in [low, high]
  double seqLow = 0.1, seqHigh = 10.0;       // mask: keep samples whose geometric-mean ratio is inside
  double klBeta = 0;                   // weight of the k3 KL to the reference policy
  bool isPolicy() const { return kind != "ce"; }
};

// Checks kinds, modes and ranges; throws with the offending field named.
void validateLossConfig(const LossConfig& cfg);

// One row's loss tokens, flattened: index j is one predicted token. All tensors [T] in one
// floating dtype. logp carries the autograd graph; the others are data.
struct LossInputs {
  at::Tensor logp;     // trainer log pi_theta(token) under softmax(logits / T)
  at::Tensor mask;     // 1 = loss token
  at::Tensor mu;       // inference (behaviour) logprobs; policy losses only
  at::Tensor adv;      // advantages; policy losses only
  at::Tensor refLogp;  // reference-policy logprobs; only when klBeta > 0
  at::Tensor entropy;  // optional, detached: for the entropy metric
  at::Tensor sample;   // int64 sample index in [0, numSamples) of each token
  int64_t numSamples = 0;
};

// Sums over the loss tokens / samples of everything seen so far in a step (metrics are these
// divided by lossTokens or samples at the end).
struct LossSums {
  double loss = 0;  // already normalised: the step loss is the plain sum over rows
  double entropy = 0, mismatchKl = 0, referenceKl = 0;
  int64_t lossTokens = 0, samples = 0, maskedTokens = 0, maskedSamples = 0, clippedTokens = 0;
};

// The step's metrics: sums turned into means over loss tokens (fractions of samples for
// maskedSampleFraction).
struct LossMetrics {
  double loss = 0, entropy = 0, mismatchKl = 0, referenceKl = 0;
  double maskedTokenFraction = 0, maskedSampleFraction = 0, clippedFraction = 0;
  int64_t lossTokens = 0, samples = 0;
};
LossMetrics lossMetrics(const LossSums& sums);

// Loss tokens and samples (with at least one loss token) in the inputs: the normaliser parts.
void countLossUnits(const at::Tensor& mask, const at::Tensor& sample, int64_t numSamples, int64_t& lossTokens,
                    int64_t& samples);
// cfg.normalizer, or else the count of the normalisation unit given (at least 1).
double resolveNormalizer(const LossConfig& cfg, int64_t lossTokens, int64_t samples);

// This row's share of the step loss (differentiable w.r.t. in.logp), already divided by
// `normalizer` (loss tokens or samples of the whole step, per cfg.normalization). Adds the
// row's metric sums to `sums`.
at::Tensor policyLoss(const LossConfig& cfg, const LossInputs& in, double normalizer, LossSums& sums);

}  // namespace prime
