// RMSNorm and rotary position embeddings.
#include "model.h"

#include "autocast.h"

namespace prime {

// RMSNorm, arithmetic in fp32, output in the input's dtype (HF: variance in fp32, cast back to the
// input dtype, then times the weight); an fp32 master weight under mixed precision computes as its
// bf16 copy (kernels.h).
at::Tensor Model::rmsNorm(const at::Tensor& x, const at::Tensor& w) const {
  return kernels().rmsNorm(x, normWeight(w), cfg.rmsNormEps);
}

// Qwen3.5 stores its norm weights as offsets from 1 (a new model's are zeros); 1 + w is computed in
// the weight's dtype, as transformers does in fp32 (bf16 weights: the kernels round it once).
at::Tensor Model::normWeight(const at::Tensor& w) const { return cfg.normOffset ? w + 1.0 : w; }

at::ScalarType Model::computeDtype() const { return AutocastGuard::active(device).value_or(dtype); }

// RoPE tables for the given positions in the activations' dtype, [N, 1, rotaryDim] (broadcast over
// heads): cos(f) twice, and sin(f) with rotate_half's sign folded in: (-sin(f), sin(f)). rotaryDim
// is headDim unless the family rotates only part of each head (Qwen3.5).
std::pair<at::Tensor, at::Tensor> Model::rope(const at::Tensor& pos) const {
  const at::Tensor f = pos.to(invFreq_.scalar_type()).unsqueeze(-1) * invFreq_.unsqueeze(0);  // [N, hd/2]
  const at::Tensor c = f.cos(), s = f.sin();
  const at::ScalarType dt = computeDtype();
  return {at::cat({c, c}, -1).to(dt).unsqueeze(1), at::cat({-s, s}, -1).to(dt).unsqueeze(1)};
}

}  // namespace prime
