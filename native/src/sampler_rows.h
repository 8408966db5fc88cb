// The sampler's passes over one row of logits (sampler.h prepareRow): included by sampler.cc (fp64
// rows) and by cpu/kernels.cc (fp32 rows, once per instruction set), inside an anonymous namespace
// each, as lm_head_rows.h is: every copy is its translation unit's own.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu_kernels.h"
#include "fast_exp.h"

namespace prime {
namespace {

inline double sampleExp(double x) { return std::exp(x); }
inline float sampleExp(float x) { return fastExp(x); }

// One row x [V] in one pass over memory: per block of cpu::kSampleBlock tokens (in L1 once read)
// its maximum m_b, then the sum s_b of exp((x - m_b) invT), kept as the block's log-sum-exp. Then
// the row's first maximum m, or -1 when the row is not a distribution (a NaN, or a non-finite
// maximum: log_softmax would be NaN); blockSums[b] = s_b exp((m_b - m) invT), the sum of
// exp((x - m) invT) over the block; and, when e is given, e = exp((x - m) invT) (a second pass:
// only filtered sampling reads every token's e).
template <typename S>
int64_t sampleRow(const S* x, int64_t V, S invT, S* e, double* blockSums) {
  const S inf = std::numeric_limits<S>::infinity();
  S mx = -inf;
  int nan = 0;
  int64_t blocks = 0, first = 0;  // where the first block holding the maximum starts
  for (int64_t b = 0; b < V; b += cpu::kSampleBlock, blocks++) {
    const int64_t end = std::min(V, b + cpu::kSampleBlock);
    S bm = -inf;
#pragma omp simd reduction(max : bm) reduction(| : nan)
    for (int64_t i = b; i < end; i++) {
      bm = x[i] > bm ? x[i] : bm;
      nan |= x[i] != x[i];
    }
    S s = 0;
    if (std::isfinite(bm)) {
#pragma omp simd reduction(+ : s)
      for (int64_t i = b; i < end; i++) s += sampleExp((x[i] - bm) * invT);
    }
    // s >= 1 (the maximum's own term) for a finite block; a block of -inf holds no mass.
    blockSums[blocks] = std::isfinite(bm) ? std::log(double(s)) + double(bm) * double(invT) : -double(inf);
    if (bm > mx) {
      mx = bm;
      first = b;
    }
  }
  if (nan || !std::isfinite(mx)) return -1;
  // The first maximum (ties go to the lower id), in its block.
  const int64_t best = std::find(x + first, x + std::min(V, first + cpu::kSampleBlock), mx) - x;
  for (int64_t b = 0; b < blocks; b++) blockSums[b] = std::exp(blockSums[b] - double(mx) * double(invT));
  if (e) {
#pragma omp simd
    for (int64_t i = 0; i < V; i++) e[i] = sampleExp((x[i] - mx) * invT);
  }
  return best;
}

}  // namespace
}  // namespace prime
