// What the per-instruction-set loops share (cpu/kernels.cc, cpu/block.cc): ATen's Vectorized<float>
// for this copy's CPU_CAPABILITY, its width, and a lane sum. In an anonymous namespace inside
// prime::cpu::<CPU_CAPABILITY>, so no copy leaks into another instruction set's (cpu/kernels.cc).
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cstdint>

namespace prime::cpu::CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t W = Vec::size();

inline float sum(const Vec& v) {
  return at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, v);
}

}  // namespace
}  // namespace prime::cpu::CPU_CAPABILITY
