// The loops of cpu_kernels.h, written once over ATen's Vectorized<float> and compiled once per
// instruction set (native/cmake/cpu_kernels.cmake: CPU_CAPABILITY is DEFAULT, AVX2 or AVX512, with
// the matching -m flags), each copy in its own namespace prime::cpu::<CPU_CAPABILITY>, as ATen's
// own kernels are: nothing defined here may be an inline function or template outside an anonymous
// namespace, or the linker could pick a copy compiled for an instruction set the CPU lacks.
#include "cpu_kernels.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/block.h"
#include "cpu/vec.h"
#include "fast_exp.h"
#include "host_parallel.h"
#include "lm_head_rows.h"
#include "sampler_rows.h"

namespace prime::cpu::CPU_CAPABILITY {
namespace {

// Key positions whose scores are computed together, and vectors of a value row accumulated
// together: 2 heads x 4 of them, 8 independent chains of fused multiply-adds.
constexpr int64_t kKeys = 4, kChunks = 4;

inline Vec loadF(const float* p) { return Vec::loadu(p); }
// bf16 -> fp32 is a 16-bit shift: widen W bf16 values to 32-bit lanes and shift them into the high
// half (a load of ATen's own, load_to_float, exists only from libtorch 2.x).
inline Vec loadF(const c10::BFloat16* p) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return Vec(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
#elif defined(CPU_CAPABILITY_AVX2)
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return Vec(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
#else
  alignas(64) float f[W];
  for (int64_t i = 0; i < W; i++) f[i] = float(p[i]);
  return Vec::loadu(f);
#endif
}
inline float toF(float x) { return x; }
inline float toF(c10::BFloat16 x) { return float(x); }
inline void fromF(float x, float* out) { *out = x; }
inline void fromF(float x, c10::BFloat16* out) { *out = c10::BFloat16(x); }

// One (token, kv head) of PagedAttentionArgs: the G query heads that share the kv head attend to
// positions 0..len-1, whose rows `row(s)` returns (K and V of position s for this kv head).
// qf: the G query rows in fp32, pre-scaled by 1 / sqrt(hd); p: scratch (resized here).
template <typename T, typename RowOf>
void attendGroup(const float* qf, int64_t G, int64_t hd, int64_t len, const T* k, const T* v, RowOf row,
                 std::vector<float>& p, T* out) {
  p.resize(size_t(G * len + 2 * hd));
  // ATen's DEFAULT Vectorized is a loop over an array: there the plain loops, which the compiler
  // vectorises for SSE2 itself, are faster.
#ifdef CPU_CAPABILITY_DEFAULT
  const bool vectorised = false;
#else
  const bool vectorised = hd % (W * kChunks) == 0;
#endif
  // Scores: two heads against kKeys positions at a time, each key row loaded once for both.
  for (int64_t g0 = 0; g0 < G; g0 += 2) {
    const int64_t g1 = std::min(g0 + 1, G - 1);  // an odd G computes its last head twice
    const float *q0 = qf + g0 * hd, *q1 = qf + g1 * hd;
    float *p0 = p.data() + g0 * len, *p1 = p.data() + g1 * len;
    int64_t s = 0;
    if (vectorised) {
      for (; s + kKeys <= len; s += kKeys) {
        const T* kr[kKeys];
        for (int64_t j = 0; j < kKeys; j++) kr[j] = k + row(s + j);
        Vec a0[kKeys], a1[kKeys];
        for (int64_t j = 0; j < kKeys; j++) a0[j] = a1[j] = Vec(0.0f);
        for (int64_t c = 0; c < hd; c += W) {
          const Vec qa = Vec::loadu(q0 + c), qb = Vec::loadu(q1 + c);
          for (int64_t j = 0; j < kKeys; j++) {
            const Vec kc = loadF(kr[j] + c);
            a0[j] = at::vec::fmadd(qa, kc, a0[j]);
            a1[j] = at::vec::fmadd(qb, kc, a1[j]);
          }
        }
        for (int64_t j = 0; j < kKeys; j++) {
          p0[s + j] = sum(a0[j]);
          p1[s + j] = sum(a1[j]);
        }
      }
    }
    for (; s < len; s++) {
      const T* kr = k + row(s);
      float d0 = 0, d1 = 0;
#pragma omp simd reduction(+ : d0, d1)
      for (int64_t d = 0; d < hd; d++) {
        d0 += q0[d] * toF(kr[d]);
        d1 += q1[d] * toF(kr[d]);
      }
      p0[s] = d0;
      p1[s] = d1;
    }
  }
  // Softmax of each head's scores (fp32; the exponentials stay unnormalised, 1 / sum scales the
  // output).
  float inv[64];
  std::vector<float> invMore;
  float* invSum = G <= 64 ? inv : (invMore.resize(size_t(G)), invMore.data());
  for (int64_t g = 0; g < G; g++) {
    float* pg = p.data() + g * len;
    const float mx = *std::max_element(pg, pg + len);
    float total = 0;
#pragma omp simd reduction(+ : total)
    for (int64_t s = 0; s < len; s++) total += (pg[s] = fastExp(pg[s] - mx));
    invSum[g] = 1.0f / total;
  }
  // Values: two heads x kChunks vectors of the output accumulated over every position at a time.
  for (int64_t g0 = 0; g0 < G; g0 += 2) {
    const int64_t g1 = std::min(g0 + 1, G - 1);
    const float *p0 = p.data() + g0 * len, *p1 = p.data() + g1 * len;
    T *o0 = out + g0 * hd, *o1 = out + g1 * hd;
    if (!vectorised) {                  // accumulated along the value rows, as the vectorised loop does
      float* acc = p.data() + G * len;  // scratch past the scores: 2 hd floats
      std::fill(acc, acc + 2 * hd, 0.0f);
      for (int64_t s = 0; s < len; s++) {
        const T* vr = v + row(s);
        const float w0 = p0[s], w1 = p1[s];
#pragma omp simd
        for (int64_t d = 0; d < hd; d++) {
          acc[d] += w0 * toF(vr[d]);
          acc[hd + d] += w1 * toF(vr[d]);
        }
      }
      for (int64_t d = 0; d < hd; d++) {
        fromF(acc[d] * invSum[g0], o0 + d);
        fromF(acc[hd + d] * invSum[g1], o1 + d);
      }
      continue;
    }
    for (int64_t c0 = 0; c0 < hd; c0 += W * kChunks) {
      Vec a0[kChunks], a1[kChunks];
      for (int64_t c = 0; c < kChunks; c++) a0[c] = a1[c] = Vec(0.0f);
      for (int64_t s = 0; s < len; s++) {
        const T* vr = v + row(s) + c0;
        const Vec w0(p0[s]), w1(p1[s]);
        for (int64_t c = 0; c < kChunks; c++) {
          const Vec vc = loadF(vr + c * W);
          a0[c] = at::vec::fmadd(w0, vc, a0[c]);
          a1[c] = at::vec::fmadd(w1, vc, a1[c]);
        }
      }
      float buf[2][W * kChunks];
      for (int64_t c = 0; c < kChunks; c++) {
        (a0[c] * Vec(invSum[g0])).store(buf[0] + c * W);
        (a1[c] * Vec(invSum[g1])).store(buf[1] + c * W);
      }
      for (int64_t d = 0; d < W * kChunks; d++) {
        fromF(buf[0][d], o0 + c0 + d);
        fromF(buf[1][d], o1 + c0 + d);
      }
    }
  }
}

template <typename T>
void pagedAttention(const PagedAttentionArgs& a) {
  const T *q = static_cast<const T*>(a.q), *k = static_cast<const T*>(a.k), *v = static_cast<const T*>(a.v);
  T* out = static_cast<T*>(a.out);
  const int64_t G = a.H / a.KV, hd = a.hd, KV = a.KV, B = a.B, stride = KV * hd;
  const float scale = float(1.0 / std::sqrt(double(hd)));
  // Parts of at least 32 (token, kv head) pairs: a batch of one decodes on the calling thread.
  hostParallelFor(a.N * KV, 32, [&](int64_t begin, int64_t end) {
    std::vector<float> p, qf(size_t(G * hd));
    std::vector<int64_t> rows;  // element offset of each position's row (kv head 0) in the cache
    int64_t rowsOf = -1;        // the token `rows` is for
    for (int64_t i = begin; i < end; i++) {
      const int64_t t = i / KV, kvh = i % KV, len = a.pos[t] + 1;
      if (rowsOf != t) {  // walked block by block: no division per position
        const int64_t* table = a.tables + a.seqOf[t] * a.width;
        rows.resize(size_t(len));
        for (int64_t s0 = 0, blk = 0; s0 < len; s0 += B, blk++)
          for (int64_t s = s0, base = table[blk] * B * stride; s < std::min(len, s0 + B); s++)
            rows[size_t(s)] = base + (s - s0) * stride;
        rowsOf = t;
      }
      const T* qg = q + (t * a.H + kvh * G) * hd;  // the group's G query heads, contiguous
      for (int64_t j = 0; j < G * hd; j++) qf[j] = toF(qg[j]) * scale;
      const int64_t* r = rows.data();
      const int64_t head = kvh * hd;
      auto row = [r, head](int64_t s) { return r[s] + head; };
      attendGroup(qf.data(), G, hd, len, k, v, row, p, out + (t * a.H + kvh * G) * hd);
    }
  });
}

// ---- y = x W^T for a few rows (LinearArgs) ------------------------------------------------------

// Accumulator tile: kRows rows of x against kCols rows of W, one vector accumulator per output
// (AVX2's 16 registers: 4 x 3 + 3 weight vectors + 1 of x; AVX-512's 32: 4 x 6 + 6 + 1).
constexpr int kRows = 4, kCols = W >= 16 ? 6 : 3;

// y[r][c] = x[r] . w[c] for R rows of x (stride ldx) and C rows of w (stride K).
template <int R, int C, typename T>
inline void dotTile(const float* x, int64_t ldx, const T* w, int64_t K, float* y, int64_t ldy) {
  Vec acc[R][C];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) acc[r][c] = Vec(0.0f);
  int64_t k = 0;
  for (; k + W <= K; k += W) {
    Vec wv[C];
    for (int c = 0; c < C; c++) wv[c] = loadF(w + c * K + k);
    for (int r = 0; r < R; r++) {
      const Vec xv = Vec::loadu(x + r * ldx + k);
      for (int c = 0; c < C; c++) acc[r][c] = at::vec::fmadd(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) {
      float total = sum(acc[r][c]);
      for (int64_t kk = k; kk < K; kk++) total += x[r * ldx + kk] * toF(w[c * K + kk]);
      y[r * ldy + c] = total;
    }
}

template <typename T>
void linear(const LinearArgs& a) {
  const T* w = static_cast<const T*>(a.w);
  const int64_t M = a.M, N = a.N, K = a.K;
  // Blocks of about 128 KiB of W: a block stays in L2 while every row of x passes over it.
  const int64_t block = std::max<int64_t>(kCols, ((int64_t(128) << 10) / (K * int64_t(sizeof(T)))) / kCols * kCols);
  const int64_t blocks = (N + block - 1) / block;
  // At least ~2 MFLOP a thread: a small product is not worth a thread's start.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(1, M * K * block));
  hostParallelFor(blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t n0 = b0 * block, nEnd = std::min(N, b1 * block); n0 < nEnd; n0 += block) {
      const int64_t n1 = std::min(nEnd, n0 + block);
      for (int64_t m = 0; m < M; m += kRows) {
        const int64_t rows = std::min<int64_t>(kRows, M - m);
        const float* xm = a.x + m * K;
        float* ym = a.y + m * a.ldy;
        int64_t n = n0;
        for (; n + kCols <= n1; n += kCols) {
          if (rows == kRows) dotTile<kRows, kCols>(xm, K, w + n * K, K, ym + n, a.ldy);
          else
            for (int64_t r = 0; r < rows; r++)
              dotTile<1, kCols>(xm + r * K, K, w + n * K, K, ym + r * a.ldy + n, a.ldy);
        }
        for (; n < n1; n++) {
          if (rows == kRows) dotTile<kRows, 1>(xm, K, w + n * K, K, ym + n, a.ldy);
          else
            for (int64_t r = 0; r < rows; r++) dotTile<1, 1>(xm + r * K, K, w + n * K, K, ym + r * a.ldy + n, a.ldy);
        }
      }
    }
  });
}

// The LM head's fp32 row kernels (lm_head_rows.h), compiled here for this copy's instruction set.
void lmHeadForward(const LmHeadRows<float>& a) {
  hostParallelFor(a.n, rowsGrain(a.V), [&](int64_t r0, int64_t r1) { forwardRowRange(a, r0, r1); });
}
void lmHeadBackward(const LmHeadRows<float>& a) {
  hostParallelFor(a.n, rowsGrain(a.V), [&](int64_t r0, int64_t r1) { backwardRowRange(a, r0, r1); });
}

// The sampler's fp32 row passes (sampler_rows.h), compiled here for this copy's instruction set.
int64_t sampleRowF32(const SampleRowArgs& a) { return sampleRow(a.x, a.V, a.invT, a.e, a.blockSums); }

// ---- the gated delta rule's recurrent step (DeltaStepArgs) --------------------------------------

// Columns of S (a v head's dv values) accumulated together: 4 vectors each for S^T k and S^T q.
constexpr int64_t kColVecs = 4;

// With a = S^T k and c = S^T q of the state before the step (one pass over S):
//   delta = beta (v - e a),  out = e c + (k . q) delta,  S <- e S + k delta^T  (a second pass).
void deltaStepOne(float* S, const float* q, const float* k, const float* v, float g, float beta, float* out, int64_t dk,
                  int64_t dv, float* delta) {
  const float e = std::exp(g);
  float kq = 0;
  for (int64_t i = 0; i < dk; i++) kq += k[i] * q[i];
  int64_t j0 = 0;
#ifndef CPU_CAPABILITY_DEFAULT
  for (; j0 + W * kColVecs <= dv; j0 += W * kColVecs) {
    Vec a[kColVecs], c[kColVecs];
    for (int64_t u = 0; u < kColVecs; u++) a[u] = c[u] = Vec(0.f);
    for (int64_t i = 0; i < dk; i++) {
      const Vec ki(k[i]), qi(q[i]);
      const float* row = S + i * dv + j0;
      for (int64_t u = 0; u < kColVecs; u++) {
        const Vec s = Vec::loadu(row + u * W);
        a[u] = at::vec::fmadd(s, ki, a[u]);
        c[u] = at::vec::fmadd(s, qi, c[u]);
      }
    }
    const Vec ev(e), bv(beta), kqv(kq);
    for (int64_t u = 0; u < kColVecs; u++) {
      const Vec d = bv * (Vec::loadu(v + j0 + u * W) - ev * a[u]);
      d.store(delta + j0 + u * W);
      (ev * c[u] + kqv * d).store(out + j0 + u * W);
    }
  }
#endif
  for (int64_t j = j0; j < dv; j++) {  // columns the vectors left (every column in the baseline copy)
    float a = 0, c = 0;
    for (int64_t i = 0; i < dk; i++) {
      a += S[i * dv + j] * k[i];
      c += S[i * dv + j] * q[i];
    }
    delta[j] = beta * (v[j] - e * a);
    out[j] = e * c + kq * delta[j];
  }
  for (int64_t i = 0; i < dk; i++) {
    float* row = S + i * dv;
    const float ki = k[i];
#pragma omp simd
    for (int64_t j = 0; j < dv; j++) row[j] = e * row[j] + ki * delta[j];
  }
}

void deltaStep(const DeltaStepArgs& a) {
  // One (row, head) is a [dk, dv] state (64 KiB at Qwen3.5's 128 x 128): a part of 4 or more.
  hostParallelFor(a.R * a.H, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> delta(size_t(a.dv));
    for (int64_t i = begin; i < end; i++) {
      const int64_t r = i / a.H, h = i % a.H;
      float* S = a.states + (a.slots[r] * a.H + h) * a.dk * a.dv;
      deltaStepOne(S, a.q + i * a.dk, a.k + i * a.dk, a.v + i * a.dv, a.g[i], a.beta[i], a.out + i * a.dv, a.dk, a.dv,
                   delta.data());
    }
  });
}

}  // namespace

extern const Kernels kKernels;
const Kernels kKernels = {
#if defined(CPU_CAPABILITY_AVX512)
    "avx512",
#elif defined(CPU_CAPABILITY_AVX2)
    "avx2",
#else
    "default",
#endif
    pagedAttention<float>,
    pagedAttention<c10::BFloat16>,
    linear<float>,
    linear<c10::BFloat16>,
    lmHeadForward,
    lmHeadBackward,
    sampleRowF32,
    deltaStep,
    rmsNorm,
    rmsNormBackward,
    rope,
    swiglu,
    swigluBackward,
};

}  // namespace prime::cpu::CPU_CAPABILITY
