// RoPE on q or k in one pass, in place: each thread owns V pairs (j, j + headDim / 2) of one head,
// reads both halves and the tables once and writes both halves. The unfused path (Model's
// applyRope) runs a flip, two products and a sum, each a trip through memory, and its backward
// as many again.
#include "common.cuh"

namespace prime::cuda {
namespace {

template <typename T, int V, bool kBackward>
__global__ void __launch_bounds__(256)
    ropeKernel(const T* x, int64_t inStride, T* out, int64_t outStride, const T* __restrict__ cos,
               const T* __restrict__ sin, int64_t tokens, int heads, int headDim) {
  // x and out may be the same memory (in place): no __restrict__ on them; each element is read
  // before it is written, by the one thread that owns it.
  const int half = headDim / 2, perHead = half / V;
  const int64_t total = tokens * heads * perHead;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / (int64_t(heads) * perHead);
    const int rem = int(i - n * heads * perHead), h = rem / perHead, j = (rem % perHead) * V;
    const T* xr = x + n * inStride + int64_t(h) * headDim;
    T* orow = out + n * outStride + int64_t(h) * headDim;
    const T* cr = cos + n * headDim;
    const T* sr = sin + n * headDim;
    const Vec<T, V> a = load<T, V>(xr + j), b = load<T, V>(xr + j + half);
    const Vec<T, V> c1 = load<T, V>(cr + j), c2 = load<T, V>(cr + j + half);
    const Vec<T, V> s1 = load<T, V>(sr + j), s2 = load<T, V>(sr + j + half);
    Vec<T, V> lo, hi;
#pragma unroll
    for (int k = 0; k < V; k++) {
      const float fa = toFloat(a.v[k]), fb = toFloat(b.v[k]);
      // forward: (a c1 + b s1, b c2 + a s2); the backward is its transpose, the sin halves swapped.
      const float sLo = toFloat(kBackward ? s2.v[k] : s1.v[k]), sHi = toFloat(kBackward ? s1.v[k] : s2.v[k]);
      lo.v[k] = fromFloat<T>(fa * toFloat(c1.v[k]) + fb * sLo);
      hi.v[k] = fromFloat<T>(fb * toFloat(c2.v[k]) + fa * sHi);
    }
    store<T, V>(orow + j, lo);
    store<T, V>(orow + j + half, hi);
  }
}

template <typename T, int V>
void launch(bool backward, const void* x, int64_t inStride, void* out, int64_t outStride, const void* cos,
            const void* sin, int64_t tokens, int heads, int headDim, cudaStream_t stream) {
  const int64_t work = tokens * heads * (headDim / 2 / V);
  const unsigned grid = gridFor(work, 256);
  auto args = [&](auto kernel) {
    kernel<<<grid, 256, 0, stream>>>(static_cast<const T*>(x), inStride, static_cast<T*>(out), outStride,
                                     static_cast<const T*>(cos), static_cast<const T*>(sin), tokens, heads, headDim);
  };
  if (backward) args(ropeKernel<T, V, true>);
  else args(ropeKernel<T, V, false>);
}

template <typename T>
void launchTyped(bool backward, const void* x, int64_t inStride, void* out, int64_t outStride, const void* cos,
                 const void* sin, int64_t tokens, int heads, int headDim, cudaStream_t stream) {
  int v = vectorWidth<T>(headDim / 2, {x, out, cos, sin});
  while (v > 1 && (inStride % v != 0 || outStride % v != 0)) v /= 2;
  switch (v) {
    case 8:  // bf16 only: 16 bytes (vectorWidth never gives 8 floats)
      launch<T, 16 / sizeof(T)>(backward, x, inStride, out, outStride, cos, sin, tokens, heads, headDim, stream);
      break;
    case 4:
      launch<T, 4>(backward, x, inStride, out, outStride, cos, sin, tokens, heads, headDim, stream);
      break;
    case 2:
      launch<T, 2>(backward, x, inStride, out, outStride, cos, sin, tokens, heads, headDim, stream);
      break;
    default:
      launch<T, 1>(backward, x, inStride, out, outStride, cos, sin, tokens, heads, headDim, stream);
  }
}

}  // namespace

cudaError_t rope(DType dt, bool backward, const void* x, int64_t inStride, void* out, int64_t outStride,
                 const void* cos, const void* sin, int64_t tokens, int64_t heads, int64_t headDim,
                 cudaStream_t stream) {
  if (tokens == 0 || heads == 0) return cudaSuccess;
  if (dt == DType::BF16)
    launchTyped<__nv_bfloat16>(backward, x, inStride, out, outStride, cos, sin, tokens, int(heads), int(headDim),
                               stream);
  else launchTyped<float>(backward, x, inStride, out, outStride, cos, sin, tokens, int(heads), int(headDim), stream);
  return cudaGetLastError();
}

}  // namespace prime::cuda
