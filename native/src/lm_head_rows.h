// The LM head's fused row kernels (lm_head.cc): the per-row quantities of the log-softmax over one
// row of raw logits, forward and backward, in place over host memory. Included by lm_head.cc (fp64
// rows) and by cpu/kernels.cc (fp32 rows, once per instruction set), inside an anonymous namespace
// each: every copy is its translation unit's own, compiled for its instruction set.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu_kernels.h"
#include "fast_exp.h"

namespace prime {
namespace {

// The unfused chain (log_softmax, gather, exp, mul, sum; softmax and mul in the backward) made
// about fourteen passes over a [tokens, vocab] chunk per step, each a trip through memory at a
// 151,936-token vocabulary. Here, with x = logits / T, m = max x, S = sum e^(x - m) and
// U = sum (x - m) e^(x - m):
//   log Z = m + log S,  logp_t = x_t - log Z,  H = -sum p log p = log S - U / S,
// and the backward needs only log Z and H per row (below). These walk host memory: CPU tensors
// only. Other devices take the same formulas as tensor ops (lm_head.cc: forwardRowsOps /
// backwardRowsOps).

inline double expOf(double x) { return std::exp(x); }
inline float expOf(float x) { return fastExp(x); }

// Elements per block of the sums: partial sums in S's precision (vectorised), blocks added in
// double, so a 151,936-term fp32 sum loses nothing a pairwise sum would keep.
constexpr int64_t kSumBlock = 2048;

struct RowStats {
  double logZ, entropy;
};

// z: one row of raw logits (length V). NaN or a non-finite maximum gives NaN statistics, as
// log_softmax would, so a broken step shows up in its loss (and the trainer refuses the weights).
template <typename S>
RowStats rowStats(const S* z, int64_t V, S invT) {
  S mx = -std::numeric_limits<S>::infinity();
  int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
  for (int64_t i = 0; i < V; i++) {
    mx = z[i] > mx ? z[i] : mx;
    nan |= z[i] != z[i];
  }
  const S m = mx * invT;  // T > 0: the maximum of z / T
  if (nan || !std::isfinite(m)) return {std::nan(""), std::nan("")};
  double sumE = 0, sumXE = 0;
  for (int64_t b = 0; b < V; b += kSumBlock) {
    const int64_t e = std::min(V, b + kSumBlock);
    S s = 0, u = 0;
#pragma omp simd reduction(+ : s, u)
    for (int64_t i = b; i < e; i++) {
      const S x = z[i] * invT - m;  // <= 0
      const S ex = expOf(x);
      s += ex;
      u += x * ex;
    }
    sumE += double(s);
    sumXE += double(u);
  }
  const double logS = std::log(sumE);
  return {double(m) + logS, logS - sumXE / sumE};
}

// In place: the row of raw logits z becomes dL/dx where x = z / T is the softmax's input. With
// p = softmax(z / T): d logp_t / d(z_j / T) = [j = t] - p_j and dH / d(z_j / T) = -p_j (log p_j + H),
// so the row is -p_j (gEnt (log p_j + H) + gLogp), plus gLogp at the target.
template <typename S>
void rowGrad(S* z, int64_t V, S invT, S logZ, S entropy, S gLogp, S gEnt, int64_t target) {
  if (gEnt == 0) {  // the usual case: entropy is a metric, its gradient 0
#pragma omp simd
    for (int64_t i = 0; i < V; i++) z[i] = -gLogp * expOf(z[i] * invT - logZ);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < V; i++) {
      const S lp = z[i] * invT - logZ;
      z[i] = -expOf(lp) * (gEnt * (lp + entropy) + gLogp);
    }
  }
  z[target] += gLogp;
}

// Rows [r0, r1) of a chunk: forward, each row's log Z, entropy and target logprob; backward, each
// row overwritten with dL/d(z / T) (rowGrad).
template <typename S>
void forwardRowRange(const cpu::LmHeadRows<S>& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; r++) {
    const S* row = a.z + r * a.V;
    const RowStats st = rowStats(row, a.V, a.invT);
    a.logZ[r] = st.logZ;
    a.entropy[r] = S(st.entropy);
    a.logp[r] = S(double(row[a.targets[r]] * a.invT) - st.logZ);
  }
}

template <typename S>
void backwardRowRange(const cpu::LmHeadRows<S>& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; r++)
    rowGrad<S>(a.z + r * a.V, a.V, a.invT, S(a.logZ[r]), a.entropy[r], a.gLogp[r], a.gEnt ? a.gEnt[r] : S(0),
               a.targets[r]);
}

}  // namespace
}  // namespace prime
