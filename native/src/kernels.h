// The element-wise blocks between a decoder's matmuls, behind one small interface with two
// implementations: libtorch's ops (unfusedBlockKernels: the default, and the reference the fused ones
// are checked against) and our fused CUDA kernels (fusedBlockKernels: native/src/cuda/, compiled by nvcc
// in CUDA builds), as autograd functions. Model picks one by its `fusedKernels` switch.
// On the CPU the fused implementation runs the engine's own loops for fp32 (cpu_kernels.h), and for
// bf16 the kernels' formulas as tensor ops (fp32 inside, one rounding per output, the same backward
// formulas): that is how the autograd functions, their backward math and their checks are tested
// on a machine without a GPU. cpuBlockKernels, the CPU's default, takes the loops for fp32 training.
#pragma once

#include <ATen/ATen.h>

#include <utility>

namespace prime {

class BlockKernels {
 public:
  virtual ~BlockKernels() = default;
  // RMSNorm over the last dimension, arithmetic in fp32, the output in x's dtype. w is x's dtype
  // or, under mixed precision, an fp32 master weight: it computes as the bf16 copy a bf16 model
  // holds, and its gradient returns in fp32.
  virtual at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) const = 0;
  // The residual add and the norm after it: {x + delta, rmsNorm(x + delta, w)}.
  virtual std::pair<at::Tensor, at::Tensor> addRmsNorm(const at::Tensor& x, const at::Tensor& delta,
                                                       const at::Tensor& w, double eps) const = 0;
  // Non-interleaved RoPE of q [N, H, hd] and k [N, KV, hd] with Model::rope's tables [N, 1, hd]:
  // cos(f) twice, and sin(f) with rotate_half's sign folded in, (-sin f, sin f).
  virtual std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                 const at::Tensor& sin) const = 0;
  // silu(gate) * up, gate and up [N, I] (they may be the halves of one [N, 2 I] projection).
  virtual at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) const = 0;
  // The same of a packed [N, 2 I] gate/up projection (gate its left half): its gradient comes back
  // as one tensor, not through two narrow views each zero-filling a full-width gradient.
  virtual at::Tensor swigluPacked(const at::Tensor& gateUp) const = 0;
};

const BlockKernels& unfusedBlockKernels();
const BlockKernels& fusedBlockKernels();
// The CPU's default: fusedBlockKernels' loops for fp32 forwards autograd records (training),
// unfusedBlockKernels otherwise (kernels.cc).
const BlockKernels& cpuBlockKernels();

// Whether this build compiled the CUDA kernels (a CUDA build with nvcc: PRIME_HAVE_CUDA_KERNELS).
bool cudaKernelsBuilt();
// Throws, naming the option, when the fused kernels cannot run on `device` in `dtype`: CUDA in a
// build without them, or a dtype they do not take (fp32 and bf16 only).
void checkFusedKernels(const at::Device& device, at::ScalarType dtype);

// The LM head's per-row quantities over a chunk of fp32 logits z [rows, vocab] on CUDA, one read of
// each row (lm_head.h has the formulas): logp, entropy (fp32) and logZ (fp64) [rows], written into
// the given tensors (contiguous views are fine).
void fusedLmHeadForward(const at::Tensor& z, const at::Tensor& targets, double temperature, at::Tensor& logp,
                        at::Tensor& entropy, at::Tensor& logZ);
// dL/d(z / T) of the chunk in `out` dtype, from one read of z (fp32 output: in place, z itself).
// gEnt may be undefined (no entropy gradient).
at::Tensor fusedLmHeadBackward(at::Tensor& z, const at::Tensor& targets, double temperature, const at::Tensor& logZ,
                               const at::Tensor& entropy, const at::Tensor& gLogp, const at::Tensor& gEnt,
                               at::ScalarType out);

}  // namespace prime
