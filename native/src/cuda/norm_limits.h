// The widths the fused RMSNorm's backward takes (rms_norm.cu), as plain C++: the host refuses a
// wider row before any launch (kernels.cc), in CPU builds too, so that the CPU tests see the
// refusal a card would give.
#pragma once

#include <cstdint>

namespace prime::cuda {

constexpr int kNormThreads = 256;   // threads of a block
constexpr int kNormMaxStrides = 8;  // strides of 256 vectors a backward row holds in registers

// The widest row of `width`'s divisibility the backward takes for elements of `elemBytes`: the
// vectors are the largest power of two of at most 16 bytes dividing the row.
inline int64_t normBackwardMaxWidth(int64_t width, int64_t elemBytes) {
  int64_t v = 16 / elemBytes;
  while (v > 1 && width % v != 0) v /= 2;
  return int64_t(kNormMaxStrides) * kNormThreads * v;
}

}  // namespace prime::cuda
