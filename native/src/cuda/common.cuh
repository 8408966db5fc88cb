// Device helpers shared by the fused kernels: fp32 <-> storage conversions, aligned vectors for
// 16-byte loads, warp and row reductions, grid sizes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "kernels.h"

namespace prime::cuda {

template <typename T>
__device__ __forceinline__ float toFloat(T v);
template <>
__device__ __forceinline__ float toFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float toFloat<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T fromFloat(float v);
template <>
__device__ __forceinline__ float fromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);  // round to nearest even, as c10::BFloat16
}

// v rounded to T's precision, kept in fp32 (a weight as a model in T holds it).
template <typename T>
__device__ __forceinline__ float roundTo(float v) {
  return toFloat<T>(fromFloat<T>(v));
}

// N consecutive elements, aligned for one vector access (16 bytes for 8 bf16 or 4 floats).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}
template <typename T, int N>
__device__ __forceinline__ void store(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

__device__ __forceinline__ float warpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum of v over the blockDim.x threads of one row (a block is blockDim.y rows of blockDim.x
// threads, blockDim.x a multiple of 32, at most 256; blockDim.y at most 8). Every thread of the
// block must call it (it synchronises when a row spans several warps); all of a row's threads get
// the sum, added in a fixed order.
__device__ __forceinline__ float rowSum(float v) {
  __shared__ float partial[8][8];
  v = warpSum(v);
  const int warps = blockDim.x / 32;
  if (warps == 1) return v;
  if (threadIdx.x % 32 == 0) partial[threadIdx.y][threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0;
  for (int i = 0; i < warps; i++) s += partial[threadIdx.y][i];
  __syncthreads();  // partial is reused by the next call
  return s;
}

// The largest vector width (elements, a power of two up to 16 bytes) dividing `n` at which every
// pointer of `ptrs` is aligned.
template <typename T>
inline int vectorWidth(int64_t n, std::initializer_list<const void*> ptrs) {
  int w = 16 / int(sizeof(T));
  auto ok = [&](int w) {
    if (n % w != 0) return false;
    for (const void* p : ptrs)
      if (p && reinterpret_cast<uintptr_t>(p) % (uintptr_t(w) * sizeof(T)) != 0) return false;
    return true;
  };
  while (w > 1 && !ok(w)) w /= 2;
  return w;
}

// Blocks for a grid-stride loop over `work` items of `perBlock` each: enough to fill the device a
// few times over, never more than the work.
inline unsigned gridFor(int64_t work, int64_t perBlock, int wavesPerSm = 4) {
  const int64_t need = (work + perBlock - 1) / perBlock;
  const int64_t cap = int64_t(multiprocessors()) * wavesPerSm * 8;
  return unsigned(need < 1 ? 1 : (need < cap ? need : cap));
}

}  // namespace prime::cuda
