// The LM head fused with the per-token log-softmax quantities the losses need, in chunks of
// tokens: never a [tokens, vocab] tensor for the whole row, forward or backward. At a
// 151,936-token vocabulary one 1,024-token row's fp32 logits are 622 MB, and the plain autograd
// graph of log_softmax(logits / T).gather(...) holds several of them.
#pragma once

#include <ATen/ATen.h>

namespace prime {

struct TokenStats {
  at::Tensor logp;     // [N] log softmax(hidden W^T / T)[t, targets[t]]
  at::Tensor entropy;  // [N] entropy of that distribution
};

// Default budget of logits kept from forward to backward, per call (one packed row): 512 MiB,
// the first 880 tokens' at a 151,936-token vocabulary in fp32 (whole chunks), bounded whatever the
// row's length. Each kept chunk spares the backward one LM-head matmul: a 512-token Qwen3-shaped
// step ran 1.17-1.22x faster keeping all of it than recomputing it (docs/benchmarks/compare.md, AMD EPYC). On a
// GPU it is under one chunk (lmHeadChunkTokens): every chunk is recomputed, and keeping all of a
// 4,096-token row's ran slower on an H100 (408 against 353 ms a step). 0 = recompute every chunk (least memory: one
// chunk buffer per row).
constexpr int64_t kLogitsKeepBytes = int64_t(512) << 20;

// Tokens per chunk: on the CPU about 32M logits (128 MB in fp32) per chunk buffer, between 16 and
// 1,024 tokens; on a GPU about 256M (1 GiB), between 16 and 8,192 tokens. Each chunk costs the
// backward one fp32 accumulation of the [vocab, hidden] weight gradient, and a GPU has the memory to
// make them few (a 4,096-token row at the Qwen3 vocabulary: 3 chunks, not 19; measured on an H100,
// docs/benchmarks/gpu.md).
int64_t lmHeadChunkTokens(int64_t vocab, const at::Device& device);

// hidden [N, D], weight [V, D] (the LM head or the tied embedding), targets [N] int64. Logits are
// computed in `logitsDtype` (fp32, or fp64 for fp64 models) as at::linear(hidden,
// weight).to(logitsDtype); the log-softmax of logits / T and its per-token quantities come from
// fused row kernels (two reads of a row forward, one backward; fp32 rows use a vectorised exp within
// 1 ulp of expf). Differentiable w.r.t. hidden and weight (both outputs): the backward recomputes
// each chunk's logits and accumulates the weight's gradient chunk by chunk; on the CPU, for a leaf
// weight, into the parameter's .grad itself (grad_into.h), autograd then adding nothing.
// chunkTokens: tokens per chunk (0 = lmHeadChunkTokens(vocab, device); on the CPU a row whose
// logits keepBytes holds whole is one chunk).
// keepBytes: how much of the forward's logits may be kept for the backward (whole chunks, the first
// ones); the backward recomputes only the chunks beyond it. Keeping one chunk costs what one chunk
// buffer costs; it saves an LM-head matmul in the backward.
// kernels: Auto = the fused row kernels on the CPU, tensor ops on other devices; TensorOps = the
// tensor ops everywhere (how tests check the other devices' path on a CPU); Fused = on CUDA our
// row kernels (native/src/cuda/lm_head.cu: one read of a chunk forward, one read and one write
// backward, the gradient straight in the GEMM's dtype) for fp32 logits, elsewhere as Auto.
enum class LmHeadKernels { Auto, TensorOps, Fused };
TokenStats chunkedTokenStats(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                             double temperature, at::ScalarType logitsDtype, int64_t chunkTokens = 0,
                             int64_t keepBytes = kLogitsKeepBytes, LmHeadKernels kernels = LmHeadKernels::Auto);

}  // namespace prime
