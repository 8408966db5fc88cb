// The fused kernels (kernels.h, the LM head's rows in lm_head.h) checked one at a time against the
// libtorch path they replace, forward and backward, on random inputs: what the `gpu` tier runs on a
// card (bench/gpu/checks.ts) and the CPU tests run on the kernels' formulas.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace prime {

struct KernelCheckOptions {
  // rmsNorm | addRmsNorm | rope | swiglu | lmHead
  std::string kernel;
  // The activations' dtype; bf16 runs as mixed precision (fp32 weights) unless weightDtype says
  // bf16. float64 reaches the fused kernels' own refusal (they take float32 and bfloat16).
  at::ScalarType dtype = at::kFloat;
  // rmsNorm, addRmsNorm, lmHead: the weight's dtype: float32 (master weights; with bf16
  // activations, mixed precision), or bfloat16 with bf16 activations (a bf16 model, and the
  // weights full sharding gathers for the forward).
  at::ScalarType weightDtype = at::kFloat;
  at::Device device = at::kCPU;
  int64_t rows = 0;         // tokens
  int64_t width = 0;        // the normed / intermediate / hidden size, or the head size (rope)
  int64_t heads = 1;        // rmsNorm: rows of [rows, heads, width] (the q/k norms); rope: q heads
  int64_t kvHeads = 1;      // rope: k heads
  int64_t vocab = 0;        // lmHead
  int64_t chunkTokens = 0;  // lmHead: tokens per chunk (0 = the device's default)
  bool entropyGrad = true;  // lmHead: the loss uses the entropy too (else its gradient is undefined)
  bool packed = false;      // swiglu: gate and up as the halves of one [rows, 2 width] tensor
  int64_t weightWidth = 0;  // rmsNorm: the weight's size (0 = width; another size tests the refusal)
  uint64_t seed = 0;
};

// One output or input gradient: its largest difference from the exact result (the unfused path in
// fp64 on the CPU, on the same rounded inputs) relative to the exact result's largest magnitude,
// for the fused and the unfused path, and the two paths' difference relative to the same scale.
struct KernelCheckOutput {
  std::string name;
  double fused = 0, unfused = 0, apart = 0, scale = 0;
};

std::vector<KernelCheckOutput> kernelCheck(const KernelCheckOptions& options);

// Seconds per forward + backward of each path on the same problem (bench/gpu/kernels.ts).
struct KernelTiming {
  double fused = 0, unfused = 0;
};
KernelTiming kernelTime(const KernelCheckOptions& options, int64_t iters);

}  // namespace prime
