// The CUDA paged decode kernel (cuda/paged_attention.h) for ATen tensors: the host side that
// checks what it is given, allocates its workspace and output, and launches it on the current
// stream. In a build without it (no nvcc, or not a CUDA build) pagedDecodeKernel says why and
// Model::pagedAttention keeps libtorch's batched matmuls.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace prime {

// Why the kernel cannot serve a model of this dtype on this device ("" when it can).
std::string pagedDecodeUnsupported(const at::Device& device, at::ScalarType dtype);

// Attention of decode rows q [n, H, hd] over the paged caches [blocks, B, KV, hd] (the same
// dtype: bf16 or fp32): row b reads positions 0..pos[b] < maxKeys through tables[b] ([n, width]
// int64). Returns [n, H, hd].
at::Tensor pagedDecodeAttention(const at::Tensor& q, const at::Tensor& kCache, const at::Tensor& vCache,
                                const at::Tensor& tables, const at::Tensor& pos, int64_t maxKeys);

}  // namespace prime
