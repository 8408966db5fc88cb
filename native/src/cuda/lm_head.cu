// The LM head's per-row quantities over one chunk of fp32 logits (native/src/lm_head.cc runs the
// chunks and their GEMMs): forward in one read of each row, with an online maximum, where the
// tensor-op path (log_softmax, gather, exp, product, sum) makes about nine passes over the chunk;
// backward in one read and one write, the gradient straight in the GEMM's dtype (bf16 under mixed
// precision) where the tensor-op path makes softmax, scatter, product and cast passes.
// With x = z / T, m the running maximum, S = sum e^(x - m), U = sum (x - m) e^(x - m):
//   log Z = m + log S,  logp_t = x_t - log Z,  H = log S - U / S.
#include <cmath>
#include <type_traits>

#include "common.cuh"

namespace prime::cuda {
namespace {

constexpr int kRowThreads = 512;

// The running (m, S, U) of a set of x; S == 0 is the empty set.
struct Stats {
  float m, s, u;
  bool nan;
};

__device__ __forceinline__ void add(Stats& a, float x) {
  if (x != x) {
    a.nan = true;
  } else if (x > a.m) {
    // Rescale to the new maximum: S' = e^(m - x) S, U' = e^(m - x) (U + (m - x) S); x adds 1 and 0.
    if (a.s > 0) {
      const float d = a.m - x, e = expf(d);
      a.u = e * (a.u + d * a.s);
      a.s *= e;
    }
    a.m = x;
    a.s += 1.f;
  } else if (x != -INFINITY) {  // e^-inf adds nothing (and -inf - -inf would be NaN)
    const float d = x - a.m, e = expf(d);
    a.s += e;
    a.u += d * e;
  }
}

__device__ __forceinline__ Stats merge(const Stats& a, const Stats& b) {
  if (b.s == 0) return {a.m, a.s, a.u, a.nan || b.nan};
  if (a.s == 0) return {b.m, b.s, b.u, a.nan || b.nan};
  const float m = fmaxf(a.m, b.m), da = a.m - m, db = b.m - m, ea = expf(da), eb = expf(db);
  return {m, ea * a.s + eb * b.s, ea * (a.u + da * a.s) + eb * (b.u + db * b.s), a.nan || b.nan};
}

__device__ __forceinline__ Stats shuffle(const Stats& a, int offset) {
  return {__shfl_xor_sync(0xffffffffu, a.m, offset), __shfl_xor_sync(0xffffffffu, a.s, offset),
          __shfl_xor_sync(0xffffffffu, a.u, offset), __shfl_xor_sync(0xffffffffu, int(a.nan), offset) != 0};
}

// One block per row (grid-stride over rows): each thread folds V-wide slices of the row, then the
// block merges the threads' stats in a fixed order.
template <int V>
__global__ void __launch_bounds__(kRowThreads)
    forwardKernel(const float* __restrict__ z, const int64_t* __restrict__ targets, float invT,
                  float* __restrict__ logp, float* __restrict__ entropy, double* __restrict__ logZ, int64_t rows,
                  int64_t vocab) {
  __shared__ Stats warpStats[kRowThreads / 32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* row = z + r * vocab;
    Stats st{-INFINITY, 0.f, 0.f, false};
    for (int64_t c = int64_t(threadIdx.x) * V; c < vocab; c += int64_t(blockDim.x) * V) {
      const Vec<float, V> v = load<float, V>(row + c);
#pragma unroll
      for (int k = 0; k < V; k++) add(st, v.v[k] * invT);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const Stats other = shuffle(st, o);
      // Merged in lane order either way round: both lanes get the same, order-fixed result.
      st = (threadIdx.x & o) ? merge(other, st) : merge(st, other);
    }
    if (threadIdx.x % 32 == 0) warpStats[threadIdx.x / 32] = st;
    __syncthreads();
    if (threadIdx.x == 0) {
      Stats all = warpStats[0];
      for (int w = 1; w < int(blockDim.x / 32); w++) all = merge(all, warpStats[w]);
      const int64_t t = targets[r];
      float lp, h;
      double lz;
      if (all.nan || !isfinite(all.m) || t < 0 || t >= vocab) {
        lp = h = NAN;
        lz = NAN;
      } else {
        const float logS = logf(all.s);
        lz = double(all.m) + double(logS);
        h = logS - all.u / all.s;
        lp = float(double(row[t] * invT) - lz);
      }
      logp[r] = lp;
      entropy[r] = h;
      logZ[r] = lz;
    }
    __syncthreads();  // warpStats is reused by the next row
  }
}

template <typename O, int V>
__global__ void __launch_bounds__(256)
    backwardKernel(const float* z, const int64_t* __restrict__ targets, float invT, const double* __restrict__ logZ,
                   const float* __restrict__ entropy, const float* __restrict__ gLogp, const float* __restrict__ gEnt,
                   O* out, int64_t rows, int64_t vocab) {
  // `out` may be `z` (fp32, in place): each element is read, then written, by one thread.
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float lz = float(logZ[r]), gl = gLogp[r], ge = gEnt ? gEnt[r] : 0.f, h = entropy[r];
    const int64_t t = targets[r];
    for (int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; c < vocab;
         c += int64_t(gridDim.x) * blockDim.x * V) {
      const Vec<float, V> v = load<float, V>(z + r * vocab + c);
      Vec<O, V> o;
#pragma unroll
      for (int k = 0; k < V; k++) {
        const float lp = v.v[k] * invT - lz, p = expf(lp);
        float g = gEnt ? -p * (ge * (lp + h) + gl) : -gl * p;
        if (c + k == t) g += gl;
        o.v[k] = fromFloat<O>(g);
      }
      store<O, V>(out + r * vocab + c, o);
    }
  }
}

}  // namespace

cudaError_t lmHeadForward(const float* z, const int64_t* targets, float invT, float* logp, float* entropy, double* logZ,
                          int64_t rows, int64_t vocab, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const unsigned grid = gridFor(rows, 1, 2);
  if (vectorWidth<float>(vocab, {z}) == 4)
    forwardKernel<4><<<grid, kRowThreads, 0, stream>>>(z, targets, invT, logp, entropy, logZ, rows, vocab);
  else forwardKernel<1><<<grid, kRowThreads, 0, stream>>>(z, targets, invT, logp, entropy, logZ, rows, vocab);
  return cudaGetLastError();
}

cudaError_t lmHeadBackward(const float* z, const int64_t* targets, float invT, const double* logZ, const float* entropy,
                           const float* gLogp, const float* gEnt, DType outDtype, void* out, int64_t rows,
                           int64_t vocab, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const bool bf16 = outDtype == DType::BF16;
  // Four elements a thread where z and out allow it (out: 8 bytes of bf16 or 16 of fp32).
  const bool vec = vectorWidth<float>(vocab, {z}) == 4 &&
                   (bf16 ? vectorWidth<__nv_bfloat16>(vocab, {out}) >= 4 : vectorWidth<float>(vocab, {out}) == 4);
  const int v = vec ? 4 : 1;
  const int64_t blocksPerRow = (vocab + 256 * v - 1) / (256 * v);
  const dim3 grid(unsigned(blocksPerRow), unsigned(rows < 65535 ? rows : 65535));
  auto run = [&](auto* o) {
    using O = std::remove_pointer_t<decltype(o)>;
    if (vec)
      backwardKernel<O, 4><<<grid, 256, 0, stream>>>(z, targets, invT, logZ, entropy, gLogp, gEnt, o, rows, vocab);
    else backwardKernel<O, 1><<<grid, 256, 0, stream>>>(z, targets, invT, logZ, entropy, gLogp, gEnt, o, rows, vocab);
  };
  if (bf16) run(static_cast<__nv_bfloat16*>(out));
  else run(static_cast<float*>(out));
  return cudaGetLastError();
}

}  // namespace prime::cuda
