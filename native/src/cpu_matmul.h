// The model's projections on the CPU when no gradient is recorded (inference: decode steps,
// prefill, scoring). A decode step multiplies a few rows by every weight: the BLAS would first copy
// each weight into its packed layout, a pass as long as the product itself at M = 64 (the LM head's
// 311 MB at the Qwen3 vocabulary), so up to 64 rows the weights are read in place by
// cpu_kernels.h's dot-product kernel. bf16: where the CPU multiplies bf16 itself (AVX-512 BF16 or
// AMX) libtorch's bf16 matmul (oneDNN) is the fast one; elsewhere (AVX2 CPUs: AMD before Zen 4,
// Intel before Cooper Lake) libtorch's bf16 GEMM falls back to a loop several times slower than
// its fp32 one, so a bf16 model's products run in fp32 on its bf16 values: the in-place kernel
// converting the weights as it reads them, or for more rows fp32 GEMMs over the weight converted
// a block of rows at a time. The sums are fp32, rounded once to the output dtype; the bf16 weights
// are what is held in memory either way.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace prime {

// Whether this CPU has bf16 dot-product instructions (AVX-512 BF16 or AMX-BF16).
bool cpuHasBf16Dot();

// x W^T + b as the model's projections run it: through fp32 GEMMs for bf16 x and W on a CPU
// without bf16 dot products when no gradient is recorded, else at::linear. In `out` dtype when
// given, else as at::linear gives it (x's dtype, or autocast's).
at::Tensor linearOn(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                    std::optional<at::ScalarType> out = std::nullopt);

}  // namespace prime
