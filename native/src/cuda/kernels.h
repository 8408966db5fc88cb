// The training step's fused CUDA kernels (one .cu unit each, compiled by nvcc in the CUDA build
// only: native/CMakeLists.txt), as plain launchers: raw pointers, sizes and a stream, no ATen, so
// nvcc compiles CUDA code alone. The autograd functions that call them, and every check of
// shapes, dtypes, devices and alignment, are host code: native/src/kernels.cc. Each launcher
// queues its kernels on `stream` and returns the launch's error (no sync, no host round trip).
// Arithmetic is fp32 inside whatever the storage dtype; each output is rounded once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace prime::cuda {

enum class DType : int { F32 = 0, BF16 = 1 };

// The device's multiprocessor count (cached per device): grid sizes.
int multiprocessors();

// ---- RMSNorm, optionally fused with the residual add (rms_norm.cu) ----------------------------
// Rows of `width` contiguous elements, `act` the activations' dtype, `weight` the weight's (fp32
// master weights under mixed precision: each weight is rounded to `act` as it is read, as a bf16
// model holds it, and its gradient comes back in fp32).
//   forward: s = delta ? x + delta : x (rounded to act; written to `sum` when delta is given),
//            rstd = 1 / sqrt(mean(s^2) + eps) (fp32, one per row), y = s * rstd * w.
cudaError_t rmsNormForward(DType act, DType weight, const void* x, const void* delta, void* sum, void* y, float* rstd,
                           const void* w, int64_t rows, int64_t width, float eps, cudaStream_t stream);
//   backward of the rows, one read of g, s (and gSum): dx = rstd (w g - n mean(w g n)) + gSum,
//   n = s rstd; gSum (the gradient the sum received from the residual stream) may be null. dx is
//   the gradient of x and of delta (null: not wanted). dw (null: not wanted) is the weight's
//   gradient, sum over rows of g n, in the weight's dtype: each block adds its rows' share into a
//   row of `workspace` (rmsNormBackwardWorkspace floats), then a second pass adds those in a fixed
//   order (deterministic). Rows up to normBackwardMaxWidth (norm_limits.h).
int64_t rmsNormBackwardWorkspace(int64_t rows, int64_t width);
cudaError_t rmsNormBackward(DType act, DType weight, const void* g, const void* gSum, const void* s, const float* rstd,
                            const void* w, void* dx, void* dw, float* workspace, int64_t rows, int64_t width,
                            cudaStream_t stream);

// ---- RoPE (rope.cu) -----------------------------------------------------------------------------
// x [tokens, heads, headDim] with token stride `inStride` (elements; heads and their elements
// contiguous); cos and sin [tokens, headDim] contiguous, in x's dtype: cos(f) twice and sin with
// rotate_half's sign folded in, (-sin f, sin f) (Model::rope). forward: out = x cos + swap(x) sin,
// swap exchanging the halves of each head; backward (the transpose): out = g cos + swap(g sin).
// `out` may be `x` (in place; the same strides).
cudaError_t rope(DType dt, bool backward, const void* x, int64_t inStride, void* out, int64_t outStride,
                 const void* cos, const void* sin, int64_t tokens, int64_t heads, int64_t headDim, cudaStream_t stream);

// ---- SwiGLU (swiglu.cu) ---------------------------------------------------------------------------
// gate and up [rows, width], row strides in elements (they may be halves of one [rows, 2 width]
// projection), out [rows, width] contiguous: out = silu(gate) up.
cudaError_t swigluForward(DType dt, const void* gate, int64_t gateStride, const void* up, int64_t upStride, void* out,
                          int64_t rows, int64_t width, cudaStream_t stream);
// From g = dL/dout (contiguous): dGate = g up sig(gate) (1 + gate (1 - sig(gate))), dUp = g silu(gate),
// in one pass, both with row stride dStride (width: two tensors; 2 width: the halves of one
// [rows, 2 width] gradient, that of a packed gate/up projection).
cudaError_t swigluBackward(DType dt, const void* g, const void* gate, int64_t gateStride, const void* up,
                           int64_t upStride, void* dGate, void* dUp, int64_t dStride, int64_t rows, int64_t width,
                           cudaStream_t stream);

// ---- The LM head's rows (lm_head.cu) ------------------------------------------------------------
// One chunk of fp32 logits z [rows, vocab] (contiguous), x = z / T. forward, one read of each row:
// log Z = log sum e^x, logp = x[target] - log Z, entropy = log Z - sum p x, with an online max
// (no separate max pass). A row holding NaN, or whose maximum is not finite, gives NaN; so does a
// target outside [0, vocab).
cudaError_t lmHeadForward(const float* z, const int64_t* targets, float invT, float* logp, float* entropy, double* logZ,
                          int64_t rows, int64_t vocab, cudaStream_t stream);
// backward, one read and one write: out = dL/dx = -p (gEnt (log p + H) + gLogp) + gLogp [j = target],
// in `outDtype` (`out` may be `z` for fp32: in place). gEnt may be null (the entropy unused).
cudaError_t lmHeadBackward(const float* z, const int64_t* targets, float invT, const double* logZ, const float* entropy,
                           const float* gLogp, const float* gEnt, DType outDtype, void* out, int64_t rows,
                           int64_t vocab, cudaStream_t stream);

}  // namespace prime::cuda
