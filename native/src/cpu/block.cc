// The block ops of cpu_kernels.h (NormArgs, RopeArgs, SwigluArgs) over ATen's Vectorized<float>,
// compiled once per instruction set beside cpu/kernels.cc (native/cmake/cpu_kernels.cmake), whose
// table names them. The same rule as there: everything here is in prime::cpu::<CPU_CAPABILITY>, and
// helpers are in an anonymous namespace.
#include "cpu/block.h"

#include <cmath>
#include <vector>

#include "cpu/vec.h"
#include "host_parallel.h"

namespace prime::cpu::CPU_CAPABILITY {
namespace {

// sum over j of a[j] * b[j] (b = a: the sum of squares).
float dot(const float* a, const float* b, int64_t n) {
  Vec acc(0.f);
  int64_t j = 0;
  for (; j + W <= n; j += W) acc = acc + Vec::loadu(a + j) * Vec::loadu(b + j);
  float s = sum(acc);
  for (; j < n; j++) s += a[j] * b[j];
  return s;
}

float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

}  // namespace

void rmsNorm(const NormArgs& a) {
  const int64_t D = a.width;
  hostParallelFor(a.rows, rowsGrain(D), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const float* x = a.x + r * D;
      float* s = a.delta ? a.s + r * D : const_cast<float*>(x);
      if (a.delta) {
        const float* d = a.delta + r * D;
        int64_t j = 0;
        for (; j + W <= D; j += W) (Vec::loadu(x + j) + Vec::loadu(d + j)).store(s + j);
        for (; j < D; j++) s[j] = x[j] + d[j];
      }
      const float rstd = 1.f / std::sqrt(dot(s, s, D) / float(D) + a.eps);
      a.rstd[r] = rstd;
      float* y = a.y + r * D;
      const Vec rv(rstd);
      int64_t j = 0;
      for (; j + W <= D; j += W) (Vec::loadu(s + j) * rv * Vec::loadu(a.w + j)).store(y + j);
      for (; j < D; j++) y[j] = s[j] * rstd * a.w[j];
    }
  });
}

void rmsNormBackward(const NormBackwardArgs& a) {
  const int64_t D = a.width;
  if (a.dx)
    hostParallelFor(a.rows, rowsGrain(D), [&](int64_t r0, int64_t r1) {
      std::vector<float> wg(size_t(D), 0.f);
      for (int64_t r = r0; r < r1; r++) {
        const float *g = a.g + r * D, *s = a.s + r * D;
        const float rstd = a.rstd[r];
        // mean(w g n) = rstd mean(w g s)
        int64_t j = 0;
        for (; j + W <= D; j += W) (Vec::loadu(g + j) * Vec::loadu(a.w + j)).store(wg.data() + j);
        for (; j < D; j++) wg[size_t(j)] = g[j] * a.w[j];
        const float m = rstd * dot(wg.data(), s, D) / float(D);
        const Vec rv(rstd), mv(m);
        float* dx = a.dx + r * D;
        const float* gs = a.gSum ? a.gSum + r * D : nullptr;
        j = 0;
        for (; j + W <= D; j += W) {
          Vec v = rv * (Vec::loadu(wg.data() + j) - Vec::loadu(s + j) * rv * mv);
          if (gs) v = v + Vec::loadu(gs + j);
          v.store(dx + j);
        }
        for (; j < D; j++) dx[j] = rstd * (wg[size_t(j)] - s[j] * rstd * m) + (gs ? gs[j] : 0.f);
      }
    });
  if (a.dw)
    // Over columns, each part summing its columns over every row in row order: the same sums
    // whatever the number of threads.
    hostParallelFor(D, std::max<int64_t>(W, (int64_t(1) << 16) / std::max<int64_t>(a.rows, 1)),
                    [&](int64_t c0, int64_t c1) {
                      std::vector<float> acc(size_t(c1 - c0), 0.f);
                      for (int64_t r = 0; r < a.rows; r++) {
                        const float *g = a.g + r * D, *s = a.s + r * D;
                        const float rstd = a.rstd[r];
                        for (int64_t j = c0; j < c1; j++) acc[size_t(j - c0)] += g[j] * (s[j] * rstd);
                      }
                      for (int64_t j = c0; j < c1; j++) a.dw[j] = acc[size_t(j - c0)];
                    });
}

void rope(const RopeArgs& a) {
  const int64_t h = a.hd / 2;
  hostParallelFor(a.N, std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(a.H * a.hd, 1)),
                  [&](int64_t t0, int64_t t1) {
                    for (int64_t t = t0; t < t1; t++) {
                      const float *c = a.cos + t * a.hd, *sn = a.sin + t * a.hd;
                      // The transpose swaps the sin table's halves.
                      const float *sLo = a.transpose ? sn + h : sn, *sHi = a.transpose ? sn : sn + h;
                      for (int64_t head = 0; head < a.H; head++) {
                        const float* x = a.x + t * a.xStride + head * a.hd;
                        float* o = a.out + t * a.outStride + head * a.hd;
                        int64_t j = 0;
                        for (; j + W <= h; j += W) {
                          const Vec lo = Vec::loadu(x + j), hi = Vec::loadu(x + h + j);
                          const Vec newLo = lo * Vec::loadu(c + j) + hi * Vec::loadu(sLo + j);
                          const Vec newHi = hi * Vec::loadu(c + h + j) + lo * Vec::loadu(sHi + j);
                          newLo.store(o + j);
                          newHi.store(o + h + j);
                        }
                        for (; j < h; j++) {
                          const float lo = x[j], hi = x[h + j];
                          o[j] = lo * c[j] + hi * sLo[j];
                          o[h + j] = hi * c[h + j] + lo * sHi[j];
                        }
                      }
                    }
                  });
}

void swiglu(const SwigluArgs& a) {
  hostParallelFor(a.N, rowsGrain(a.I), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const float *g = a.gate + r * a.ldg, *u = a.up + r * a.ldu;
      float* o = a.out + r * a.I;
      const Vec one(1.f);
      int64_t j = 0;
      for (; j + W <= a.I; j += W) {
        const Vec gv = Vec::loadu(g + j);
        (gv / (one + gv.neg().exp()) * Vec::loadu(u + j)).store(o + j);
      }
      for (; j < a.I; j++) o[j] = g[j] * sigmoid(g[j]) * u[j];
    }
  });
}

void swigluBackward(const SwigluArgs& a) {
  hostParallelFor(a.N, rowsGrain(a.I), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
      const float *g = a.gate + r * a.ldg, *u = a.up + r * a.ldu, *go = a.grad + r * a.I;
      float *dg = a.dGate + r * a.ldd, *du = a.dUp + r * a.ldd;
      const Vec one(1.f);
      int64_t j = 0;
      for (; j + W <= a.I; j += W) {
        const Vec gv = Vec::loadu(g + j), gov = Vec::loadu(go + j);
        const Vec s = one / (one + gv.neg().exp());
        (gov * Vec::loadu(u + j) * s * (one + gv * (one - s))).store(dg + j);
        (gov * gv * s).store(du + j);
      }
      for (; j < a.I; j++) {
        const float s = sigmoid(g[j]);
        dg[j] = go[j] * u[j] * s * (1.f + g[j] * (1.f - s));
        du[j] = go[j] * g[j] * s;
      }
    }
  });
}

}  // namespace prime::cpu::CPU_CAPABILITY
