// Decode attention over the paged KV cache on CUDA (paged_attention.cu, compiled by nvcc in the
// CUDA build only), flash-decoding style: the positions of each (sequence, kv head) are split into
// partitions of kPagedPartition that run as blocks of their own (a long context fills the card at
// any batch), each reading its keys and values once for the query heads that share them (GQA) and
// writing a partial softmax; a second kernel combines the partitions. Reads the block tables and
// positions from device memory: no host round trip, capturable in a CUDA graph. Plain launcher
// (raw pointers, a stream), no ATen: the host side that checks shapes and allocates is
// native/src/paged_decode.cc. Declared weak: in a build without nvcc the symbol is null and the
// engine keeps libtorch's attention (Model::decodeAttentionBmm).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace prime::cuda {

constexpr int64_t kPagedPartition = 256;  // positions per partition (one block of the first kernel)

// Floats of workspace for n sequences of H query heads, head size hd, maxKeys positions at most.
inline int64_t pagedDecodeWorkspace(int64_t n, int64_t H, int64_t hd, int64_t maxKeys) {
  return n * H * ((maxKeys + kPagedPartition - 1) / kPagedPartition) * (hd + 2);
}

// q [n, H, hd] (row stride qStride elements), out [n, H, hd] contiguous, both in the cache's dtype
// (bf16: true, else fp32); caches [blocks, blockSize, KV, hd] contiguous; tables [n, width] and
// pos [n] int64: row b attends to positions 0..pos[b] < maxKeys, position s in block
// tables[b][s / blockSize]. Scores, softmax and sums in fp32; out rounded once.
cudaError_t pagedDecodeAttention(bool bf16, const void* q, int64_t qStride, const void* kCache, const void* vCache,
                                 const int64_t* tables, int64_t width, const int64_t* pos, void* out, float* workspace,
                                 int64_t n, int64_t H, int64_t KV, int64_t hd, int64_t blockSize, int64_t maxKeys,
                                 float scale, cudaStream_t stream) __attribute__((weak));

}  // namespace prime::cuda
