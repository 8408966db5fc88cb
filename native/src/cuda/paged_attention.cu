// Decode attention over the paged KV cache, flash-decoding style (paged_attention.h says what).
#include "paged_attention.h"

#include <cuda_bf16.h>

#include <atomic>

#include "common.cuh"

namespace prime::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;  // query heads per kv head accumulated in registers at once

// Partition blockIdx.x (P positions) of kv head blockIdx.y of sequence blockIdx.z, for its G query
// heads. A sequence of one partition gets its output here; a longer one's partition writes its
// maximum score, sum of exp(score - max) and sum of exp(score - max) v per head into the
// workspace ([sequence, query head, partition] x (2 + hd)) for combineKernel. Partitions past the
// sequence's end do nothing (nothing reads them). Each row of K and V is read once, V elements a
// lane, for every query head of the group.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    partialKernel(const T* __restrict__ q, int64_t qStride, const T* __restrict__ k, const T* __restrict__ v,
                  const int64_t* __restrict__ tables, int64_t width, const int64_t* __restrict__ pos,
                  float* __restrict__ ws, T* __restrict__ out, int H, int KV, int hd, int B, int parts, int P,
                  float scale) {
  extern __shared__ int64_t smem[];  // the int64 row offsets first (8-byte alignment)
  const int part = blockIdx.x, h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int len = int(pos[b]) + 1, start = part * P;
  if (start >= len) return;
  constexpr int kQ = V < 4 ? V : 4;  // floats of a query read from shared memory at once
  const int count = min(len - start, P), G = H / KV;
  const bool single = len <= P;
  int64_t* rows = smem;                            // [P]: where each position's row of this kv head starts
  float* qs = reinterpret_cast<float*>(rows + P);  // [G, hd]: the queries, scaled; then the weighted sums
  float* sc = qs + G * hd;                         // [G, P]: scores, then exp(score - max)
  float* stat = sc + G * P;                        // [2, G]: max and sum per head
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // One table lookup and one divide per position for the whole block.
  const int64_t* table = tables + b * width;
  const int64_t rowStride = int64_t(KV) * hd, head = int64_t(h) * hd;
  for (int i = threadIdx.x; i < count; i += kThreads) {
    const int s = start + i;
    rows[i] = (table[s / B] * B + s % B) * rowStride + head;
  }
  const T* qb = q + b * qStride + int64_t(h) * G * hd;
  for (int i = threadIdx.x; i < G * hd; i += kThreads) qs[i] = toFloat(qb[i]) * scale;
  __syncthreads();
  // Scores: a warp per position, its lanes over the row in vectors of V (coalesced), for up to
  // kMaxGroup heads per read.
  for (int i = warp; i < count; i += kWarps) {
    const T* kr = k + rows[i];
    for (int g0 = 0; g0 < G; g0 += kMaxGroup) {
      const int gn = min(kMaxGroup, G - g0);
      float dot[kMaxGroup];
#pragma unroll
      for (int g = 0; g < kMaxGroup; g++) dot[g] = 0.f;
      for (int d = lane * V; d < hd; d += 32 * V) {
        const Vec<T, V> x = load<T, V>(kr + d);
#pragma unroll
        for (int g = 0; g < kMaxGroup; g++)
          if (g < gn) {
            const float* qg = qs + (g0 + g) * hd + d;
#pragma unroll
            for (int e0 = 0; e0 < V; e0 += kQ) {  // the queries in 16-byte reads (no bank conflicts)
              const Vec<float, kQ> qv = load<float, kQ>(qg + e0);
#pragma unroll
              for (int e = 0; e < kQ; e++) dot[g] += qv.v[e] * toFloat(x.v[e0 + e]);
            }
          }
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; g++)
        if (g < gn) {  // the same for the whole warp: warpSum's shuffles see every lane
          const float s = warpSum(dot[g]);
          if (lane == 0) sc[(g0 + g) * P + i] = s;
        }
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
  // sum_i e_i v_i: warp w takes positions w, w + kWarps, ..., each lane V elements of a row (chunks
  // of 32 V when the row is longer); the warps' partial sums are then added in warp order (a fixed
  // order: the same result every run) into qs, which the scores no longer need.
  const int chunks = (hd + 32 * V - 1) / (32 * V);
  for (int g0 = 0; g0 < G; g0 += kMaxGroup) {
    const int gn = min(kMaxGroup, G - g0);
    for (int c = 0; c < chunks; c++) {
      const int d = (c * 32 + lane) * V;
      const bool active = d < hd;
      float acc[kMaxGroup][V];
#pragma unroll
      for (int g = 0; g < kMaxGroup; g++)
#pragma unroll
        for (int e = 0; e < V; e++) acc[g][e] = 0.f;
      if (active) {
        for (int i = warp; i < count; i += kWarps) {
          const Vec<T, V> x = load<T, V>(v + rows[i] + d);
#pragma unroll
          for (int g = 0; g < kMaxGroup; g++)
            if (g < gn) {
              const float p = sc[(g0 + g) * P + i];
#pragma unroll
              for (int e = 0; e < V; e++) acc[g][e] += p * toFloat(x.v[e]);
            }
        }
      }
      // Unrolled, so that acc stays in registers (no spills).
#pragma unroll
      for (int w = 0; w < kWarps; w++) {
        if (warp == w && active) {
#pragma unroll
          for (int g = 0; g < kMaxGroup; g++)
            if (g < gn) {
#pragma unroll
              for (int e = 0; e < V; e++) {
                float* r = qs + g * hd + d + e;
                *r = (w == 0 ? 0.f : *r) + acc[g][e];
              }
            }
        }
        __syncthreads();
      }
    }
    // The group's rows: the output itself (one partition), or this partition's share.
    for (int i = threadIdx.x; i < gn * hd; i += kThreads) {
      const int g = i / hd, d = i % hd;
      const int64_t row = b * H + int64_t(h) * G + g0 + g;  // sequence x query head
      if (single) out[row * hd + d] = fromFloat<T>(qs[i] / stat[G + g0 + g]);
      else ws[(row * parts + part) * (hd + 2) + 2 + d] = qs[i];
    }
    __syncthreads();  // qs holds the next group's sums next
  }
  if (!single && threadIdx.x < G) {
    float* w = ws + ((b * H + int64_t(h) * G + threadIdx.x) * parts + part) * (hd + 2);
    w[0] = stat[threadIdx.x];
    w[1] = stat[G + threadIdx.x];
  }
}

// Row blockIdx.x (sequence x query head) of a sequence longer than one partition: its partitions
// (those its length reaches, not every one of the key bucket) weighted by exp(max_p - max) into
// softmax-normalised output.
template <typename T>
__global__ void __launch_bounds__(kThreads) combineKernel(const float* __restrict__ ws, const int64_t* __restrict__ pos,
                                                          T* __restrict__ out, int H, int parts, int P, int hd) {
  extern __shared__ float weight[];  // [parts]: exp(max_p - max)
  const int64_t row = blockIdx.x;
  const int np = int((pos[row / H] + P) / P);  // ceil((pos + 1) / P)
  if (np == 1) return;                         // partialKernel wrote this row's output
  const float* w = ws + row * parts * (hd + 2);
  float m = -INFINITY;
  for (int p = 0; p < np; p++) m = fmaxf(m, w[p * (hd + 2)]);  // every partition below np holds positions
  for (int p = threadIdx.x; p < np; p += blockDim.x) weight[p] = expf(w[p * (hd + 2)] - m);
  __syncthreads();
  float sum = 0.f;
  for (int p = 0; p < np; p++) sum += weight[p] * w[p * (hd + 2) + 1];
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.f;
    for (int p = 0; p < np; p++) acc += weight[p] * w[p * (hd + 2) + 2 + d];
    out[row * hd + d] = fromFloat<T>(acc / sum);
  }
}

template <typename T, int V>
cudaError_t launch(const void* q, int64_t qStride, const void* k, const void* v, const int64_t* tables, int64_t width,
                   const int64_t* pos, void* out, float* ws, int64_t n, int64_t H, int64_t KV, int64_t hd, int64_t B,
                   int64_t maxKeys, int64_t P, float scale, cudaStream_t stream) {
  const int parts = int((maxKeys + P - 1) / P);
  const int64_t shared = pagedDecodeSharedBytes(H / KV, hd, P);
  auto* kernel = &partialKernel<T, V>;
  if (shared > kDefaultSharedBytes) {
    // Opted in once per device (an attribute of the function on the current device): at most what
    // the device allows, which pagedDecodePlan kept to.
    static std::atomic<int64_t> optedIn[64];
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    if (device >= 64 || optedIn[device].load() < shared) {
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
      if (err != cudaSuccess) return err;
      if (device < 64) optedIn[device].store(shared);
    }
  }
  kernel<<<dim3(unsigned(parts), unsigned(KV), unsigned(n)), kThreads, size_t(shared), stream>>>(
      static_cast<const T*>(q), qStride, static_cast<const T*>(k), static_cast<const T*>(v), tables, width, pos, ws,
      static_cast<T*>(out), int(H), int(KV), int(hd), int(B), parts, int(P), scale);
  if (parts > 1)
    combineKernel<T><<<unsigned(n * H), kThreads, size_t(parts) * sizeof(float), stream>>>(
        ws, pos, static_cast<T*>(out), int(H), parts, int(P), int(hd));
  return cudaGetLastError();
}

// The vector width (elements) of K/V reads: at most 16 bytes, dividing hd, at which both caches
// are aligned, and narrow enough that a row keeps a whole warp busy.
template <typename T>
int widthFor(int64_t hd, const void* k, const void* v) {
  int w = vectorWidth<T>(hd, {k, v});
  while (w > 1 && hd / w < 32) w /= 2;
  return w;
}

template <typename T>
cudaError_t launchTyped(const void* q, int64_t qStride, const void* k, const void* v, const int64_t* tables,
                        int64_t width, const int64_t* pos, void* out, float* ws, int64_t n, int64_t H, int64_t KV,
                        int64_t hd, int64_t B, int64_t maxKeys, int64_t P, float scale, cudaStream_t stream) {
  constexpr int kMax = 16 / int(sizeof(T));
  const int w = widthFor<T>(hd, k, v);
  if (w >= kMax)
    return launch<T, kMax>(q, qStride, k, v, tables, width, pos, out, ws, n, H, KV, hd, B, maxKeys, P, scale, stream);
  if (w >= 4)  // bf16 only
    return launch<T, 4>(q, qStride, k, v, tables, width, pos, out, ws, n, H, KV, hd, B, maxKeys, P, scale, stream);
  if (w == 2)
    return launch<T, 2>(q, qStride, k, v, tables, width, pos, out, ws, n, H, KV, hd, B, maxKeys, P, scale, stream);
  return launch<T, 1>(q, qStride, k, v, tables, width, pos, out, ws, n, H, KV, hd, B, maxKeys, P, scale, stream);
}

}  // namespace

cudaError_t pagedDecodeAttention(bool bf16, const void* q, int64_t qStride, const void* kCache, const void* vCache,
                                 const int64_t* tables, int64_t width, const int64_t* pos, void* out, float* workspace,
                                 int64_t n, int64_t H, int64_t KV, int64_t hd, int64_t blockSize, int64_t maxKeys,
                                 int64_t partition, float scale, cudaStream_t stream) {
  // Grid limits: n and KV are grid dimensions (at most 65,535); positions are 32-bit inside; the
  // combine keeps one float per partition in the default shared memory.
  const int64_t parts = partition > 0 ? (maxKeys + partition - 1) / partition : 0;
  if (n < 1 || n > 65535 || KV < 1 || KV > 65535 || H % KV != 0 || hd < 1 || blockSize < 1 || maxKeys < 1 ||
      maxKeys >= (int64_t(1) << 31) || partition < 1 || parts * int64_t(sizeof(float)) > kDefaultSharedBytes ||
      (parts > 1 && workspace == nullptr))
    return cudaErrorInvalidValue;
  return bf16 ? launchTyped<__nv_bfloat16>(q, qStride, kCache, vCache, tables, width, pos, out, workspace, n, H, KV, hd,
                                           blockSize, maxKeys, partition, scale, stream)
              : launchTyped<float>(q, qStride, kCache, vCache, tables, width, pos, out, workspace, n, H, KV, hd,
                                   blockSize, maxKeys, partition, scale, stream);
}

}  // namespace prime::cuda
