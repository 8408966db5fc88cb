// SwiGLU, silu(gate) * up, forward and backward in one pass each (the unfused path: silu, then a
// product; in the backward silu's backward and two products).
#include <type_traits>

#include "common.cuh"

namespace prime::cuda {
namespace {

// expf, not __expf: the fast one loses digits for large |x| (the fp32 checks hold to 1e-5).
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// Element (r, c) of `rows x width` as i = r * (width / V) + c / V, V elements at a time.
template <typename T, int V>
__global__ void __launch_bounds__(256)
    forwardKernel(const T* __restrict__ gate, int64_t gateStride, const T* __restrict__ up, int64_t upStride,
                  T* __restrict__ out, int64_t rows, int width) {
  const int perRow = width / V;
  const int64_t total = rows * perRow;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / perRow;
    const int c = int(i - r * perRow) * V;
    const Vec<T, V> g = load<T, V>(gate + r * gateStride + c), u = load<T, V>(up + r * upStride + c);
    Vec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; k++) {
      const float x = toFloat(g.v[k]);
      o.v[k] = fromFloat<T>(x * sigmoid(x) * toFloat(u.v[k]));
    }
    store<T, V>(out + r * width + c, o);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(256)
    backwardKernel(const T* __restrict__ grad, const T* __restrict__ gate, int64_t gateStride, const T* __restrict__ up,
                   int64_t upStride, T* __restrict__ dGate, T* __restrict__ dUp, int64_t dStride, int64_t rows,
                   int width) {
  const int perRow = width / V;
  const int64_t total = rows * perRow;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / perRow;
    const int c = int(i - r * perRow) * V;
    const Vec<T, V> go = load<T, V>(grad + r * width + c);
    const Vec<T, V> g = load<T, V>(gate + r * gateStride + c), u = load<T, V>(up + r * upStride + c);
    Vec<T, V> dg, du;
#pragma unroll
    for (int k = 0; k < V; k++) {
      const float x = toFloat(g.v[k]), s = sigmoid(x), gr = toFloat(go.v[k]);
      // d silu(x) / dx = s (1 + x (1 - s))
      dg.v[k] = fromFloat<T>(gr * toFloat(u.v[k]) * s * (1.f + x * (1.f - s)));
      du.v[k] = fromFloat<T>(gr * x * s);
    }
    store<T, V>(dGate + r * dStride + c, dg);
    store<T, V>(dUp + r * dStride + c, du);
  }
}

// The vector width at these pointers and row strides (elements).
template <typename T>
int widthOf(int64_t width, int64_t strideA, int64_t strideB, int64_t strideC, std::initializer_list<const void*> ptrs) {
  int v = vectorWidth<T>(width, ptrs);
  while (v > 1 && (strideA % v != 0 || strideB % v != 0 || strideC % v != 0)) v /= 2;
  return v;
}

// Calls f(T(), std::integral_constant<int, V>()) for dt and a vector width v (at most 16 bytes).
template <typename F>
void dispatch(DType dt, int v, F&& f) {
  auto byWidth = [&](auto t) {
    constexpr int kMax = 16 / int(sizeof(t));
    if (v >= kMax) f(t, std::integral_constant<int, kMax>());
    else if (v >= 4) f(t, std::integral_constant<int, 4>());
    else if (v == 2) f(t, std::integral_constant<int, 2>());
    else f(t, std::integral_constant<int, 1>());
  };
  if (dt == DType::BF16) byWidth(__nv_bfloat16());
  else byWidth(float());
}

}  // namespace

cudaError_t swigluForward(DType dt, const void* gate, int64_t gateStride, const void* up, int64_t upStride, void* out,
                          int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows == 0 || width == 0) return cudaSuccess;
  const int v = dt == DType::BF16 ? widthOf<__nv_bfloat16>(width, gateStride, upStride, width, {gate, up, out})
                                  : widthOf<float>(width, gateStride, upStride, width, {gate, up, out});
  dispatch(dt, v, [&](auto t, auto vec) {
    using T = decltype(t);
    constexpr int V = decltype(vec)::value;
    forwardKernel<T, V><<<gridFor(rows * (width / V), 256), 256, 0, stream>>>(static_cast<const T*>(gate), gateStride,
                                                                              static_cast<const T*>(up), upStride,
                                                                              static_cast<T*>(out), rows, int(width));
  });
  return cudaGetLastError();
}

cudaError_t swigluBackward(DType dt, const void* g, const void* gate, int64_t gateStride, const void* up,
                           int64_t upStride, void* dGate, void* dUp, int64_t dStride, int64_t rows, int64_t width,
                           cudaStream_t stream) {
  if (rows == 0 || width == 0) return cudaSuccess;
  const int v = dt == DType::BF16
                    ? widthOf<__nv_bfloat16>(width, gateStride, upStride, dStride, {g, gate, up, dGate, dUp})
                    : widthOf<float>(width, gateStride, upStride, dStride, {g, gate, up, dGate, dUp});
  dispatch(dt, v, [&](auto t, auto vec) {
    using T = decltype(t);
    constexpr int V = decltype(vec)::value;
    backwardKernel<T, V><<<gridFor(rows * (width / V), 256), 256, 0, stream>>>(
        static_cast<const T*>(g), static_cast<const T*>(gate), gateStride, static_cast<const T*>(up), upStride,
        static_cast<T*>(dGate), static_cast<T*>(dUp), dStride, rows, int(width));
  });
  return cudaGetLastError();
}

}  // namespace prime::cuda
