// Decode attention over the paged KV cache, flash-decoding style (paged_attention.h says what).
#include "paged_attention.h"

#include <cuda_bf16.h>

#include "common.cuh"

namespace prime::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;  // query heads per kv head held in registers at once
constexpr int P = int(kPagedPartition);

// Partition blockIdx.x of kv head blockIdx.y of sequence blockIdx.z, for its G query heads: the
// partition's maximum score, sum of exp(score - max) and sum of exp(score - max) v, per head, into
// the workspace ([sequence, query head, partition] x (2 + hd)). An empty partition (past the
// sequence's length) writes max -inf and zeros.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    partialKernel(const T* __restrict__ q, int64_t qStride, const T* __restrict__ k, const T* __restrict__ v,
                  const int64_t* __restrict__ tables, int64_t width, const int64_t* __restrict__ pos,
                  float* __restrict__ ws, int H, int KV, int hd, int B, int parts, float scale) {
  extern __shared__ float smem[];
  const int part = blockIdx.x, h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int G = H / KV;
  const int64_t len = pos[b] + 1, start = int64_t(part) * P, end = min(len, start + P);
  float* out0 = ws + ((b * H + int64_t(h) * G) * parts + part) * (hd + 2);  // head g: + g * parts * (hd + 2)
  const int64_t headStride = int64_t(parts) * (hd + 2);
  if (start >= end) {
    for (int i = threadIdx.x; i < G * (hd + 2); i += blockDim.x) {
      const int g = i / (hd + 2), j = i % (hd + 2);
      out0[g * headStride + j] = j == 0 ? -INFINITY : 0.f;
    }
    return;
  }
  float* qs = smem;          // [G, hd]: the queries, scaled
  float* sc = qs + G * hd;   // [G, P]: scores, then exp(score - max)
  float* stat = sc + G * P;  // [2, G]: max and sum per head
  for (int i = threadIdx.x; i < G * hd; i += blockDim.x)
    qs[i] = toFloat(q[b * qStride + int64_t(h) * G * hd + i]) * scale;
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, count = int(end - start);
  const int64_t rowStride = int64_t(KV) * hd;  // from one position to the next in a block
  // Scores: a warp per position, its lanes over the head's elements (one coalesced row of K).
  for (int i = warp; i < count; i += kWarps) {
    const int64_t s = start + i;
    const T* kr = k + (tables[b * width + s / B] * B + s % B) * rowStride + int64_t(h) * hd;
    for (int g = 0; g < G; g++) {
      float dot = 0.f;
      for (int d = lane; d < hd; d += 32) dot += qs[g * hd + d] * toFloat(kr[d]);
      dot = warpSum(dot);
      if (lane == 0) sc[g * P + i] = dot;
    }
  }
  __syncthreads();
  for (int g = warp; g < G; g += kWarps) {
    float m = -INFINITY;
    for (int i = lane; i < count; i += 32) m = fmaxf(m, sc[g * P + i]);
    m = warpMax(m);
    float sum = 0.f;
    for (int i = lane; i < count; i += 32) {
      const float e = expf(sc[g * P + i] - m);
      sc[g * P + i] = e;
      sum += e;
    }
    sum = warpSum(sum);
    if (lane == 0) {
      stat[g] = m;
      stat[G + g] = sum;
    }
  }
  __syncthreads();
  // sum_i e_i v_i: a thread per element, reading each row of V once for up to kMaxGroup heads.
  for (int g0 = 0; g0 < G; g0 += kMaxGroup) {
    const int gn = min(kMaxGroup, G - g0);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
      float acc[kMaxGroup];
#pragma unroll
      for (int g = 0; g < kMaxGroup; g++) acc[g] = 0.f;
      for (int i = 0; i < count; i++) {
        const int64_t s = start + i;
        const float x = toFloat(v[(tables[b * width + s / B] * B + s % B) * rowStride + int64_t(h) * hd + d]);
#pragma unroll
        for (int g = 0; g < kMaxGroup; g++)
          if (g < gn) acc[g] += sc[(g0 + g) * P + i] * x;
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; g++)
        if (g < gn) out0[(g0 + g) * headStride + 2 + d] = acc[g];
    }
  }
  if (threadIdx.x < G) {
    out0[threadIdx.x * headStride] = stat[threadIdx.x];
    out0[threadIdx.x * headStride + 1] = stat[G + threadIdx.x];
  }
}

// Row blockIdx.x (sequence x query head): the partitions weighted by exp(max_p - max) into
// softmax-normalised output.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    combineKernel(const float* __restrict__ ws, T* __restrict__ out, int parts, int hd) {
  const int64_t row = blockIdx.x;
  const float* w = ws + row * parts * (hd + 2);
  float m = -INFINITY;
  for (int p = 0; p < parts; p++) m = fmaxf(m, w[p * (hd + 2)]);
  float sum = 0.f;  // the first partition is never empty (a sequence reads position 0 at least)
  for (int p = 0; p < parts; p++) sum += w[p * (hd + 2) + 1] * expf(w[p * (hd + 2)] - m);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.f;
    for (int p = 0; p < parts; p++) acc += expf(w[p * (hd + 2)] - m) * w[p * (hd + 2) + 2 + d];
    out[row * hd + d] = fromFloat<T>(acc / sum);
  }
}

template <typename T>
cudaError_t launch(const void* q, int64_t qStride, const void* k, const void* v, const int64_t* tables, int64_t width,
                   const int64_t* pos, void* out, float* ws, int64_t n, int64_t H, int64_t KV, int64_t hd, int64_t B,
                   int64_t maxKeys, float scale, cudaStream_t stream) {
  const int parts = int((maxKeys + P - 1) / P), G = int(H / KV);
  const size_t shared = (size_t(G) * hd + size_t(G) * P + 2 * size_t(G)) * sizeof(float);
  partialKernel<T><<<dim3(unsigned(parts), unsigned(KV), unsigned(n)), kThreads, shared, stream>>>(
      static_cast<const T*>(q), qStride, static_cast<const T*>(k), static_cast<const T*>(v), tables, width, pos, ws,
      int(H), int(KV), int(hd), int(B), parts, scale);
  combineKernel<T><<<unsigned(n * H), kThreads, 0, stream>>>(ws, static_cast<T*>(out), parts, int(hd));
  return cudaGetLastError();
}

}  // namespace

cudaError_t pagedDecodeAttention(bool bf16, const void* q, int64_t qStride, const void* kCache, const void* vCache,
                                 const int64_t* tables, int64_t width, const int64_t* pos, void* out, float* workspace,
                                 int64_t n, int64_t H, int64_t KV, int64_t hd, int64_t blockSize, int64_t maxKeys,
                                 float scale, cudaStream_t stream) {
  // Grid limits: n is the third grid dimension (at most 65,535); the scores of a partition and
  // the queries of a kv head's group live in shared memory (48 KiB without opting in).
  const int64_t G = KV > 0 ? H / KV : 0;
  if (n < 1 || n > 65535 || KV < 1 || H % KV != 0 || hd < 1 || blockSize < 1 || maxKeys < 1 ||
      (G * hd + G * P + 2 * G) * int64_t(sizeof(float)) > 48 * 1024)
    return cudaErrorInvalidValue;
  return bf16 ? launch<__nv_bfloat16>(q, qStride, kCache, vCache, tables, width, pos, out, workspace, n, H, KV, hd,
                                      blockSize, maxKeys, scale, stream)
              : launch<float>(q, qStride, kCache, vCache, tables, width, pos, out, workspace, n, H, KV, hd, blockSize,
                              maxKeys, scale, stream);
}

}  // namespace prime::cuda
