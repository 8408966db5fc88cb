// exp(x) in fp32 written so that a `#pragma omp simd` loop vectorises it. The C library's expf is
// a call per element, which the compiler does not vectorise without -ffast-math; ATen's
// vectorised exp (Sleef) is only reachable through whole-tensor ops, which cost a pass over
// memory each. Used by the fused row kernels of the LM head (lm_head.cc), where one pass computes
// exp, its sum and sum(x * exp) together.
#pragma once

#include <cstdint>

namespace prime {

// Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2, a degree-6 polynomial for exp(r), times 2^n
// built from its exponent bits. Within 2 ulp of expf on [-87, 88]; exactly 0 below -87 (where expf
// gives denormals or 0), +inf from 88.4 on (expf: from 88.7), NaN for NaN. The callers here pass
// x <= 0 (logits minus their maximum).
__attribute__((always_inline)) inline float fastExp(float x) {
  // n = round(x / ln2) by the 1.5 * 2^23 trick (no floor: a libm call, or a branch, that stops
  // vectorisation), clamped to [-127, 128] so the conversion below is always defined (a NaN
  // clamps to -127; the polynomial keeps the NaN).
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  n = n > -127.0f ? n : -127.0f;
  n = n < 128.0f ? n : 128.0f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln2 split in two (C1 - C2) for exactness
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;  // 2^n (n = 128 gives the bits of +inf)
  const float scale = __builtin_bit_cast(float, bits);
  return x < -87.0f ? 0.0f : p * scale;
}

}  // namespace prime
