// RMSNorm fused with the residual add, forward and backward, the weight's gradient in the same
// backward pass. libtorch's fused RMSNorm computes that gradient in GammaBetaBackward, the largest
// kernel of a Qwen3-0.6B training step on an H200 (17 ms over 226 norms, mostly the q/k norms'
// 128-wide weights over [tokens x heads] rows); here each block adds its rows' share of it while it
// computes their input gradient, and a short second pass adds the blocks' shares.
//
// A block is 256 threads: rows of `tpr` threads (32..256, enough to cover a row in vectors), 256 /
// tpr rows side by side, each thread striding its row by tpr vectors. The forward reads a row twice
// (the statistic, then the output; the second read mostly hits L1/L2); the backward reads each
// input once, holding a thread's vectors of g and s in registers between the row's statistic and
// its gradient (rows of up to kMaxStrides strides: 16,384 bf16 or 8,192 fp32 elements).
#include <type_traits>

#include "common.cuh"
#include "norm_limits.h"

namespace prime::cuda {
namespace {

constexpr int kThreads = kNormThreads;

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

// The backward of rows, reading g, s (and gSum) once: dx = rstd (w g - n mean(w g n)) + gSum, n = s
// rstd (dx null: not wanted); and, partial non-null, the weight's gradient, sum of g n over the
// block's rows, into partial[blockIdx.x] (columnSumKernel then adds the blocks' rows). kStrides:
// the strides of tpr x V elements a row takes (held in registers).
template <typename T, typename W, int V, int kStrides, bool kGSum>
__global__ void __launch_bounds__(kThreads)
    backwardKernel(const T* __restrict__ g, const T* __restrict__ gSum, const T* __restrict__ s,
                   const float* __restrict__ rstd, const W* __restrict__ w, T* __restrict__ dx,
                   float* __restrict__ partial, int64_t rows, int width) {
  const int step = blockDim.x * V;
  const int64_t rowStep = int64_t(gridDim.x) * blockDim.y;
  float dw[kStrides][V];  // this thread's columns, summed over its rows
#pragma unroll
  for (int j = 0; j < kStrides; j++)
#pragma unroll
    for (int i = 0; i < V; i++) dw[j][i] = 0.f;
  // Every thread runs the same iterations (rowSum synchronises the block); rows past the end idle.
  for (int64_t base = int64_t(blockIdx.x) * blockDim.y; base < rows; base += rowStep) {
    const int64_t r = base + threadIdx.y;
    const bool active = r < rows;
    const float rs = active ? rstd[r] : 0.f;
    Vec<T, V> gv[kStrides], sv[kStrides];
    float dot = 0;  // sum of (w g) n over the row
#pragma unroll
    for (int j = 0; j < kStrides; j++) {
      const int c = threadIdx.x * V + j * step;
      if (!active || c >= width) continue;
      gv[j] = load<T, V>(g + r * width + c);
      sv[j] = load<T, V>(s + r * width + c);
      const Vec<W, V> wv = load<W, V>(w + c);
#pragma unroll
      for (int i = 0; i < V; i++) {
        const float gi = toFloat(gv[j].v[i]), n = toFloat(sv[j].v[i]) * rs;
        dot += gi * roundTo<T>(toFloat(wv.v[i])) * n;
        dw[j][i] += gi * n;
      }
    }
    const float mean = rowSum(dot) / float(width);
    if (!active || dx == nullptr) continue;
#pragma unroll
    for (int j = 0; j < kStrides; j++) {
      const int c = threadIdx.x * V + j * step;
      if (c >= width) continue;
      const Vec<W, V> wv = load<W, V>(w + c);
      Vec<T, V> gs;
      if (kGSum) gs = load<T, V>(gSum + r * width + c);
      Vec<T, V> out;
#pragma unroll
      for (int i = 0; i < V; i++) {
        const float wg = toFloat(gv[j].v[i]) * roundTo<T>(toFloat(wv.v[i])), n = toFloat(sv[j].v[i]) * rs;
        out.v[i] = fromFloat<T>(rs * (wg - n * mean) + (kGSum ? toFloat(gs.v[i]) : 0.f));
      }
      store<T, V>(dx + r * width + c, out);
    }
  }
  if (partial == nullptr) return;
  // The block's rows side by side, added in order (y = 0 first) into its row of `partial`.
  float* out = partial + int64_t(blockIdx.x) * width;
  for (int y = 0; y < int(blockDim.y); y++) {
    if (int(threadIdx.y) == y) {
#pragma unroll
      for (int j = 0; j < kStrides; j++) {
        const int c = threadIdx.x * V + j * step;
        if (c >= width) continue;
#pragma unroll
        for (int i = 0; i < V; i++) out[c + i] = (y == 0 ? 0.f : out[c + i]) + dw[j][i];
      }
    }
    __syncthreads();  // the next row's additions read this one's
  }
}

// The weight gradient's second pass: block (32, 8) adds the rows of `partial` for 32 columns, the
// 8 threads of a column each a strided eighth of the rows (coalesced across the 32), then their 8
// sums in order: a fixed order, the same result every run.
template <typename W>
__global__ void __launch_bounds__(kThreads)
    columnSumKernel(const float* __restrict__ partial, int64_t blocks, int width, W* __restrict__ dw) {
  __shared__ float red[8][32];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float t = 0;
  if (c < width)
    for (int64_t k = threadIdx.y; k < blocks; k += 8) t += partial[k * width + c];
  red[threadIdx.y][threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.y == 0 && c < width) {
    float sum = 0;
#pragma unroll
    for (int y = 0; y < 8; y++) sum += red[y][threadIdx.x];
    dw[c] = fromFloat<W>(sum);
  }
}

// Threads per row: the fewest warps (up to 8) whose vectors cover the row in one stride.
int threadsPerRow(int64_t width, int v) {
  int t = 32;
  while (t < kThreads && int64_t(t) * v < width) t *= 2;
  return t;
}

// Strides of a backward row (tpr threads x v elements each) in registers, at most kMaxStrides; 0
// for a row wider than that (normBackwardMaxWidth: the host refuses it first).
constexpr int kMaxStrides = kNormMaxStrides;
int backwardStrides(int64_t width, int v) {
  const int64_t step = int64_t(threadsPerRow(width, v)) * v, need = (width + step - 1) / step;
  int strides = 1;
  while (strides < need) strides *= 2;
  return strides <= kMaxStrides ? strides : 0;
}

// Blocks of the backward: a few per multiprocessor (each block's share of the weight's gradient is
// a row of the workspace the second pass reads), never more than the rows need.
unsigned backwardBlocks(int64_t rows, int rowsPerBlock) { return gridFor(rows, rowsPerBlock, 1); }

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

template <typename T, typename W, int V, int kStrides>
void launchBackward(const void* g, const void* gSum, const void* s, const float* rstd, const void* w, void* dx,
                    void* dw, float* workspace, int64_t rows, int width, cudaStream_t stream) {
  const int tpr = threadsPerRow(width, V);
  const dim3 block(tpr, kThreads / tpr);
  const unsigned grid = backwardBlocks(rows, int(block.y));
  auto* gp = static_cast<const T*>(g);
  auto* sp = static_cast<const T*>(s);
  auto* wp = static_cast<const W*>(w);
  float* partial = dw ? workspace : nullptr;
  if (gSum)
    backwardKernel<T, W, V, kStrides, true><<<grid, block, 0, stream>>>(gp, static_cast<const T*>(gSum), sp, rstd, wp,
                                                                        static_cast<T*>(dx), partial, rows, width);
  else
    backwardKernel<T, W, V, kStrides, false>
        <<<grid, block, 0, stream>>>(gp, nullptr, sp, rstd, wp, static_cast<T*>(dx), partial, rows, width);
  if (dw)
    columnSumKernel<W>
        <<<unsigned((width + 31) / 32), dim3(32, 8), 0, stream>>>(workspace, int64_t(grid), width, static_cast<W*>(dw));
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

int64_t rmsNormBackwardWorkspace(int64_t rows, int64_t width) {
  // Every block of the backward is a row of it: at most one block per row, and at most
  // backwardBlocks' cap whatever the rows per block.
  return int64_t(gridFor(rows, 1, 1)) * width;
}

cudaError_t rmsNormBackward(DType act, DType weight, const void* g, const void* gSum, const void* s, const float* rstd,
                            const void* w, void* dx, void* dw, float* workspace, int64_t rows, int64_t width,
                            cudaStream_t stream) {
  if (rows == 0 || (dx == nullptr && dw == nullptr)) return cudaSuccess;
  const int v = actWidth(act, weight, width, {g, gSum, s, dx}, w);
  const int strides = backwardStrides(width, v);
  if (strides == 0 || (dw != nullptr && workspace == nullptr)) return cudaErrorInvalidValue;
  const bool ok = dispatch(act, weight, v, [&](auto t, auto wt, auto vec) {
    using T = decltype(t);
    using W = decltype(wt);
    constexpr int V = decltype(vec)::value;
    const int w32 = int(width);
    switch (strides) {
      case 1:
        return launchBackward<T, W, V, 1>(g, gSum, s, rstd, w, dx, dw, workspace, rows, w32, stream);
      case 2:
        return launchBackward<T, W, V, 2>(g, gSum, s, rstd, w, dx, dw, workspace, rows, w32, stream);
      case 4:
        return launchBackward<T, W, V, 4>(g, gSum, s, rstd, w, dx, dw, workspace, rows, w32, stream);
      default:
        return launchBackward<T, W, V, kMaxStrides>(g, gSum, s, rstd, w, dx, dw, workspace, rows, w32, stream);
    }
  });
  return ok ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace prime::cuda
