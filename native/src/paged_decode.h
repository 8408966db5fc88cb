// The CUDA paged decode kernel (cuda/paged_attention.h) for ATen tensors: the host side that
// checks what it is given, plans the kernel's blocks for the device (paged_decode_plan.h),
// allocates its workspace and output, and launches it on the caches' device and its current
// stream. In a build without it (no nvcc, or not a CUDA build), or for a shape it cannot serve,
// pagedDecodeUnsupported says why and the generator refuses `pagedAttentionKernel` when it is made.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "paged_decode_plan.h"

namespace prime {

// Why the kernel cannot serve decode rows of this dtype and shape (H query heads over KV kv heads
// of size hd, contexts of up to maxKeys positions) on this device ("" when it can).
std::string pagedDecodeUnsupported(const at::Device& device, at::ScalarType dtype, int64_t H, int64_t KV, int64_t hd,
                                   int64_t maxKeys);

// The kernel's plan on this device: pagedDecodePlan with the device's opt-in shared memory limit
// (read once per device); with kDefaultSharedBytes off CUDA or in a build without CUDA.
PagedDecodePlan pagedDecodePlanOn(const at::Device& device, int64_t H, int64_t KV, int64_t hd, int64_t maxKeys);

// Attention of decode rows q [n, H, hd] over the paged caches [blocks, B, KV, hd] (the same
// dtype: bf16 or fp32): row b reads positions 0..pos[b] < maxKeys through tables[b] ([n, width]
// int64). Returns [n, H, hd].
at::Tensor pagedDecodeAttention(const at::Tensor& q, const at::Tensor& kCache, const at::Tensor& vCache,
                                const at::Tensor& tables, const at::Tensor& pos, int64_t maxKeys);

}  // namespace prime
