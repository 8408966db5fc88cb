// The engine's CPU loops (cpu_kernels.h) checked against exact results, each instruction set's copy
// that this CPU runs: the in-place GEMM and attention over a paged cache, fp32 and bf16, and the LM
// head's fp32 row kernels, the gated delta rule's recurrent step and the block ops (RMSNorm, RoPE,
// SwiGLU), on random inputs with shapes that reach every tile and tail
// (test/native.cpu-kernels.test.ts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace prime {

// One kernel on one problem: its largest difference from the exact result (fp64 on the same rounded
// inputs) relative to the exact result's largest magnitude.
struct CpuKernelCheck {
  std::string isa, kernel, dtype, shape;
  double error = 0;
};

std::vector<CpuKernelCheck> cpuKernelCheck(uint64_t seed);

}  // namespace prime
