// RMSNorm fused with the residual add, forward and backward, and its weight's gradient as a plain
// column reduction. libtorch's fused RMSNorm computes that gradient in GammaBetaBackward, the
// largest kernel of a Qwen3-0.6B training step on an H200 (17 ms over 226 norms, mostly the q/k
// norms' 128-wide weights over [tokens x heads] rows); here it is two short passes: partial sums of
// row blocks, then their sum.
//
// A block is 256 threads: rows of `tpr` threads (32..256, enough to cover a row in vectors), 256 /
// tpr rows side by side, each thread striding its row by tpr vectors. Rows are read twice (the
// statistic, then the output); the second read mostly hits L1/L2.
#include <type_traits>

#include "common.cuh"

namespace prime::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T, typename W, int V, bool kDelta>
__global__ void __launch_bounds__(kThreads)
    forwardKernel(const T* __restrict__ x, const T* __restrict__ delta, T* __restrict__ sum, T* __restrict__ y,
                  float* __restrict__ rstd, const W* __restrict__ w, int64_t rows, int width, float eps) {
  const int step = blockDim.x * V;
  const int64_t rowStep = int64_t(gridDim.x) * blockDim.y;
  // Every thread runs the same iterations (rowSum synchronises the block); rows past the end idle.
  for (int64_t base = int64_t(blockIdx.x) * blockDim.y; base < rows; base += rowStep) {
    const int64_t r = base + threadIdx.y;
    const bool active = r < rows;
    float ss = 0;
    if (active) {
      const T* xr = x + r * width;
      for (int c = threadIdx.x * V; c < width; c += step) {
        Vec<T, V> a = load<T, V>(xr + c);
        if (kDelta) {
          const Vec<T, V> d = load<T, V>(delta + r * width + c);
#pragma unroll
          for (int i = 0; i < V; i++) a.v[i] = fromFloat<T>(toFloat(a.v[i]) + toFloat(d.v[i]));
          store<T, V>(sum + r * width + c, a);  // the residual stream, rounded as an add would
        }
#pragma unroll
        for (int i = 0; i < V; i++) {
          const float f = toFloat(a.v[i]);
          ss += f * f;
        }
      }
    }
    const float rs = rsqrtf(rowSum(ss) / float(width) + eps);
    if (!active) continue;
    if (threadIdx.x == 0) rstd[r] = rs;
    // This thread wrote these elements of `sum` itself just above: no synchronisation needed.
    const T* sr = (kDelta ? sum : x) + r * width;
    for (int c = threadIdx.x * V; c < width; c += step) {
      const Vec<T, V> a = load<T, V>(sr + c);
      const Vec<W, V> wv = load<W, V>(w + c);
      Vec<T, V> out;
#pragma unroll
      for (int i = 0; i < V; i++) out.v[i] = fromFloat<T>(toFloat(a.v[i]) * rs * roundTo<T>(toFloat(wv.v[i])));
      store<T, V>(y + r * width + c, out);
    }
  }
}

template <typename T, typename W, int V, bool kGSum>
__global__ void __launch_bounds__(kThreads)
    backwardKernel(const T* __restrict__ g, const T* __restrict__ gSum, const T* __restrict__ s,
                   const float* __restrict__ rstd, const W* __restrict__ w, T* __restrict__ dx, int64_t rows,
                   int width) {
  const int step = blockDim.x * V;
  const int64_t rowStep = int64_t(gridDim.x) * blockDim.y;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.y; base < rows; base += rowStep) {
    const int64_t r = base + threadIdx.y;
    const bool active = r < rows;
    const float rs = active ? rstd[r] : 0.f;
    float dot = 0;  // sum of (w g) n over the row
    if (active) {
      for (int c = threadIdx.x * V; c < width; c += step) {
        const Vec<T, V> gv = load<T, V>(g + r * width + c), sv = load<T, V>(s + r * width + c);
        const Vec<W, V> wv = load<W, V>(w + c);
#pragma unroll
        for (int i = 0; i < V; i++) dot += toFloat(gv.v[i]) * roundTo<T>(toFloat(wv.v[i])) * (toFloat(sv.v[i]) * rs);
      }
    }
    const float mean = rowSum(dot) / float(width);
    if (!active) continue;
    for (int c = threadIdx.x * V; c < width; c += step) {
      const Vec<T, V> gv = load<T, V>(g + r * width + c), sv = load<T, V>(s + r * width + c);
      const Vec<W, V> wv = load<W, V>(w + c);
      Vec<T, V> gs;
      if (kGSum) gs = load<T, V>(gSum + r * width + c);
      Vec<T, V> out;
#pragma unroll
      for (int i = 0; i < V; i++) {
        const float wg = toFloat(gv.v[i]) * roundTo<T>(toFloat(wv.v[i])), n = toFloat(sv.v[i]) * rs;
        out.v[i] = fromFloat<T>(rs * (wg - n * mean) + (kGSum ? toFloat(gs.v[i]) : 0.f));
      }
      store<T, V>(dx + r * width + c, out);
    }
  }
}

// The weight gradient's first pass: block (32, 8) sums g n over rows [split x rowsPerSplit, ...)
// for 32 x V columns: threads along x read consecutive vectors of a row (coalesced), the 8 along
// y interleave rows; the 8 partial sums are then added in order through shared memory.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    weightGradPartialKernel(const T* __restrict__ g, const T* __restrict__ s, const float* __restrict__ rstd,
                            float* __restrict__ partial, int64_t rows, int width, int64_t rowsPerSplit) {
  __shared__ float red[8][32 * V];
  const int c = (blockIdx.x * 32 + threadIdx.x) * V;
  const int64_t r0 = int64_t(blockIdx.y) * rowsPerSplit, r1 = min(rows, r0 + rowsPerSplit);
  float acc[V];
#pragma unroll
  for (int i = 0; i < V; i++) acc[i] = 0;
  if (c < width) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      const float rs = rstd[r];
      const Vec<T, V> gv = load<T, V>(g + r * width + c), sv = load<T, V>(s + r * width + c);
#pragma unroll
      for (int i = 0; i < V; i++) acc[i] += toFloat(gv.v[i]) * (toFloat(sv.v[i]) * rs);
    }
  }
#pragma unroll
  for (int i = 0; i < V; i++) red[threadIdx.y][threadIdx.x * V + i] = acc[i];
  __syncthreads();
  if (threadIdx.y == 0 && c < width) {
#pragma unroll
    for (int i = 0; i < V; i++) {
      float t = 0;
      for (int k = 0; k < int(blockDim.y); k++) t += red[k][threadIdx.x * V + i];
      partial[int64_t(blockIdx.y) * width + c + i] = t;
    }
  }
}

// The second pass: each column's partial sums added in split order.
template <typename W>
__global__ void columnSumKernel(const float* __restrict__ partial, int64_t splits, int width, W* __restrict__ dw) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x) {
    float t = 0;
    for (int64_t k = 0; k < splits; k++) t += partial[k * width + c];
    dw[c] = fromFloat<W>(t);
  }
}

// Rows per split of the weight gradient: at least 128 rows each, at most 4 splits per
// multiprocessor.
int64_t weightGradSplits(int64_t rows) {
  const int64_t want = (rows + 127) / 128, cap = int64_t(multiprocessors()) * 4;
  return want < 1 ? 1 : (want < cap ? want : cap);
}

// Threads per row: the fewest warps (up to 8) whose vectors cover the row in one stride.
int threadsPerRow(int64_t width, int v) {
  int t = 32;
  while (t < kThreads && int64_t(t) * v < width) t *= 2;
  return t;
}

template <typename T, typename W>
int widthFor(int64_t width, std::initializer_list<const void*> act, const void* w) {
  int v = vectorWidth<T>(width, act);
  while (v > 1 && reinterpret_cast<uintptr_t>(w) % (uintptr_t(v) * sizeof(W)) != 0) v /= 2;
  return v;
}

template <typename T, typename W, int V>
void launchForward(const void* x, const void* delta, void* sum, void* y, float* rstd, const void* w, int64_t rows,
                   int width, float eps, cudaStream_t stream) {
  const int tpr = threadsPerRow(width, V);
  const dim3 block(tpr, kThreads / tpr);
  const unsigned grid = gridFor(rows, block.y);
  if (delta)
    forwardKernel<T, W, V, true><<<grid, block, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(delta),
                                                             static_cast<T*>(sum), static_cast<T*>(y), rstd,
                                                             static_cast<const W*>(w), rows, width, eps);
  else
    forwardKernel<T, W, V, false><<<grid, block, 0, stream>>>(static_cast<const T*>(x), nullptr, nullptr,
                                                              static_cast<T*>(y), rstd, static_cast<const W*>(w), rows,
                                                              width, eps);
}

template <typename T, typename W, int V>
void launchBackward(const void* g, const void* gSum, const void* s, const float* rstd, const void* w, void* dx,
                    int64_t rows, int width, cudaStream_t stream) {
  const int tpr = threadsPerRow(width, V);
  const dim3 block(tpr, kThreads / tpr);
  const unsigned grid = gridFor(rows, block.y);
  auto* gp = static_cast<const T*>(g);
  auto* sp = static_cast<const T*>(s);
  auto* wp = static_cast<const W*>(w);
  if (gSum)
    backwardKernel<T, W, V, true>
        <<<grid, block, 0, stream>>>(gp, static_cast<const T*>(gSum), sp, rstd, wp, static_cast<T*>(dx), rows, width);
  else
    backwardKernel<T, W, V, false>
        <<<grid, block, 0, stream>>>(gp, nullptr, sp, rstd, wp, static_cast<T*>(dx), rows, width);
}

template <typename T, typename W, int V>
void launchWeightGrad(const void* g, const void* s, const float* rstd, void* dw, float* workspace, int64_t rows,
                      int width, cudaStream_t stream) {
  const int64_t splits = weightGradSplits(rows), rowsPerSplit = (rows + splits - 1) / splits;
  const dim3 grid(unsigned((width + 32 * V - 1) / (32 * V)), unsigned(splits)), block(32, 8);
  weightGradPartialKernel<T, V><<<grid, block, 0, stream>>>(static_cast<const T*>(g), static_cast<const T*>(s), rstd,
                                                            workspace, rows, width, rowsPerSplit);
  columnSumKernel<W><<<gridFor(width, 256), 256, 0, stream>>>(workspace, splits, width, static_cast<W*>(dw));
}

// Calls f(T(), W(), std::integral_constant<int, V>()) for the dtypes and a vector width v in
// {1, 2, 4, 8} (at most 16 bytes of T); false for a pair of dtypes without kernels (fp32
// activations with a bf16 weight).
template <typename F>
bool dispatch(DType act, DType weight, int v, F&& f) {
  auto byWidth = [&](auto t, auto w) {
    constexpr int kMax = 16 / int(sizeof(t));
    if (v >= 8) f(t, w, std::integral_constant<int, kMax>());
    else if (v >= 4) f(t, w, std::integral_constant<int, 4>());
    else if (v == 2) f(t, w, std::integral_constant<int, 2>());
    else f(t, w, std::integral_constant<int, 1>());
  };
  if (act == DType::F32 && weight == DType::F32) byWidth(float(), float());
  else if (act == DType::BF16 && weight == DType::BF16) byWidth(__nv_bfloat16(), __nv_bfloat16());
  else if (act == DType::BF16 && weight == DType::F32) byWidth(__nv_bfloat16(), float());
  else return false;
  return true;
}

// Narrower vectors where a row has fewer than 32 of them: a whole warp busy (a 128-wide q/k norm
// row in bf16 is 32 vectors of 4, not 16 of 8).
int busyWarp(int v, int64_t width) {
  while (v > 1 && width / v < 32) v /= 2;
  return v;
}

// The vector width for rows of `width` at these activation pointers and weight.
int actWidth(DType act, DType weight, int64_t width, std::initializer_list<const void*> ptrs, const void* w) {
  if (act == DType::BF16)
    return busyWarp(weight == DType::F32 ? widthFor<__nv_bfloat16, float>(width, ptrs, w)
                                         : widthFor<__nv_bfloat16, __nv_bfloat16>(width, ptrs, w),
                    width);
  return busyWarp(widthFor<float, float>(width, ptrs, w), width);
}

}  // namespace

cudaError_t rmsNormForward(DType act, DType weight, const void* x, const void* delta, void* sum, void* y, float* rstd,
                           const void* w, int64_t rows, int64_t width, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int v = actWidth(act, weight, width, {x, delta, sum, y}, w);
  const bool ok = dispatch(act, weight, v, [&](auto t, auto wt, auto vec) {
    launchForward<decltype(t), decltype(wt), decltype(vec)::value>(x, delta, sum, y, rstd, w, rows, int(width), eps,
                                                                   stream);
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t rmsNormBackward(DType act, DType weight, const void* g, const void* gSum, const void* s, const float* rstd,
                            const void* w, void* dx, int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int v = actWidth(act, weight, width, {g, gSum, s, dx}, w);
  const bool ok = dispatch(act, weight, v, [&](auto t, auto wt, auto vec) {
    launchBackward<decltype(t), decltype(wt), decltype(vec)::value>(g, gSum, s, rstd, w, dx, rows, int(width), stream);
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

int64_t rmsNormWeightGradWorkspace(int64_t rows, int64_t width) { return weightGradSplits(rows) * width; }

cudaError_t rmsNormWeightGrad(DType act, DType weight, const void* g, const void* s, const float* rstd, void* dw,
                              float* workspace, int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int v = busyWarp(
      act == DType::BF16 ? vectorWidth<__nv_bfloat16>(width, {g, s}) : vectorWidth<float>(width, {g, s}), width);
  const bool ok = dispatch(act, weight, v, [&](auto t, auto wt, auto vec) {
    launchWeightGrad<decltype(t), decltype(wt), decltype(vec)::value>(g, s, rstd, dw, workspace, rows, int(width),
                                                                      stream);
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace prime::cuda
