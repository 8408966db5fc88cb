// Decode attention over the paged KV cache on CUDA (paged_attention.cu, compiled by nvcc in the
// CUDA build only), flash-decoding style: the positions of each (sequence, kv head) are split into
// partitions (paged_decode_plan.h) that run as blocks of their own (a long context fills the card
// at any batch), each reading its keys and values once, in vectors, for the query heads that share
// them (GQA). A sequence whose positions fit one partition is finished by its block; a longer one's
// blocks write partial softmaxes that a second kernel combines, over that sequence's own partitions
// only. Reads the block tables and positions from device memory: no host round trip, capturable in
// a CUDA graph. Plain launcher (raw pointers, a stream), no ATen: the host side that checks shapes,
// plans and allocates is native/src/paged_decode.cc. Declared weak: in a build without nvcc the
// symbol is null and the engine keeps libtorch's attention (Model::decodeAttentionBmm).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "paged_decode_plan.h"

namespace prime::cuda {

// q [n, H, hd] (row stride qStride elements), out [n, H, hd] contiguous, both in the cache's dtype
// (bf16: true, else fp32); caches [blocks, blockSize, KV, hd] contiguous; tables [n, width] and
// pos [n] int64: row b attends to positions 0..pos[b] < maxKeys < 2^31, position s in block
// tables[b][s / blockSize]. `partition` from pagedDecodePlan for this device (a block above
// kDefaultSharedBytes of shared memory is opted in to it, once per device); workspace:
// pagedDecodeWorkspace floats. Scores, softmax and sums in fp32; out rounded once. Call with the
// caches' device current.
cudaError_t pagedDecodeAttention(bool bf16, const void* q, int64_t qStride, const void* kCache, const void* vCache,
                                 const int64_t* tables, int64_t width, const int64_t* pos, void* out, float* workspace,
                                 int64_t n, int64_t H, int64_t KV, int64_t hd, int64_t blockSize, int64_t maxKeys,
                                 int64_t partition, float scale, cudaStream_t stream) __attribute__((weak));

}  // namespace prime::cuda
