// Hand-written CPU loops compiled once per x86 instruction set (cpu/kernels.cc is built three
// times: the baseline x86-64, AVX2 + FMA, AVX-512), the one for this CPU chosen when first used, as
// ATen chooses its own kernels (ATEN_CPU_CAPABILITY=default|avx2|avx512 lowers both choices). The
// rest of the addon is compiled for the baseline x86-64, which every CPU runs, so a loop that needs
// AVX2 or AVX-512 to be fast lives here, behind this table.
#pragma once

#include <cstdint>
#include <string>

namespace prime::cpu {

// Attention over the paged KV cache (model.h PagedKV, PagedBatch) for the tokens of one forward:
// token t attends to positions 0..pos[t] of table row seqOf[t]. q, out [N, H, hd]; caches [blocks,
// B, KV, hd]; all of the element type the kernel is for (fp32 or bf16: scores, softmax and sums in
// fp32). Keys are visited in position order whatever the blocks.
struct PagedAttentionArgs {
  const void *q, *k, *v;
  void* out;
  const int64_t *pos, *seqOf, *tables;
  int64_t width, N, H, KV, hd, B;
};
using PagedAttentionFn = void (*)(const PagedAttentionArgs&);

// y = x W^T for a few rows of x: x [M, K] fp32 (rows contiguous), W [N, K] fp32 or bf16 (the
// kernel's element type), y [M, N] fp32 with row stride ldy. Each output is one dot product over K
// summed in fp32 lanes, so W is read in place, never packed: where M is small (decode steps) the
// GEMM is a pass over the weights, which a BLAS would copy into its packed layout first. Split
// over N between the host threads.
struct LinearArgs {
  const float* x;
  const void* w;
  float* y;
  int64_t M, N, K, ldy;
};
using LinearFn = void (*)(const LinearArgs&);

// The LM head's row kernels over one chunk of raw logits z [n, V] (lm_head_rows.h has the
// formulas), the rows split between the host threads. Forward: logZ, logp and entropy of each row
// (targets checked by the caller). Backward: each row overwritten with dL/d(z / T) from logZ,
// entropy, gLogp and gEnt (null: no entropy gradient).
template <typename S>
struct LmHeadRows {
  S* z;
  const int64_t* targets;
  int64_t n, V;
  S invT;
  double* logZ;
  S *logp, *entropy;
  const S *gLogp, *gEnt;
};
using LmHeadRowsFn = void (*)(const LmHeadRows<float>&);

// The sampler's passes over one row of fp32 logits x [V] (sampler_rows.h sampleRow: the first
// maximum, or -1 for a row that is not a distribution; e = exp((x - max) invT) and the sums of e
// by blocks of kSampleBlock tokens, which the inverse-CDF scan steps over). On the calling thread:
// the sampler splits its rows between the host threads.
constexpr int64_t kSampleBlock = 256;
struct SampleRowArgs {
  const float* x;
  float* e;
  double* blockSums;  // ceil(V / kSampleBlock)
  int64_t V;
  float invT;
};
using SampleRowFn = int64_t (*)(const SampleRowArgs&);

// One recurrent step of the gated delta rule (Qwen3.5's Gated DeltaNet decode) for R rows, in
// place on their state slots: for row r and v head h, with S = states[slots[r], h] [dk, dv],
//   S <- e S + k (beta (v - e S^T k))^T,  out = S^T q  (after the update),  e = exp(g)
// in two passes over S (a read, then a read and write) instead of libtorch's gather, five
// tensor-sized temporaries, two batched products and a scatter. q, k [R, H, dk]; v, out [R, H,
// dv]; g, beta [R, H]; states [slots, H, dk, dv]; all fp32, contiguous. Split over (row, head)
// between the host threads.
struct DeltaStepArgs {
  const float *q, *k, *v, *g, *beta;
  const int64_t* slots;
  float *states, *out;
  int64_t R, H, dk, dv;
};
using DeltaStepFn = void (*)(const DeltaStepArgs&);

// The block ops between a decoder's matmuls (kernels.h: RMSNorm with the residual add, RoPE,
// SwiGLU), forward and backward, on fp32 rows: one pass (two for a norm's weight gradient) where
// libtorch 1.13's ops make several, each on one thread; rows split between the host threads. The
// formulas are the fused CUDA kernels' (kernels.h), arithmetic in fp32.
// RMSNorm: s = x (+ delta, written to s when delta is given), rstd = 1 / sqrt(mean(s^2) + eps),
// y = s rstd w. x, delta, s, y [rows, width] contiguous; rstd [rows].
struct NormArgs {
  const float *x, *delta, *w;
  float *s, *y, *rstd;
  int64_t rows, width;
  float eps;
};
// Its backward, n = s rstd: dx = rstd (w g - n mean(w g n)) (+ gSum), when dx is given; dw = the
// sum over rows of g n, when dw is given. g, gSum, s, dx [rows, width] contiguous.
struct NormBackwardArgs {
  const float *g, *gSum, *s, *rstd, *w;
  float *dx, *dw;
  int64_t rows, width;
};
// RoPE of x [N, H, hd] (heads and their elements contiguous, tokens `xStride` apart) into out (may
// be x): out = x cos + swap(x) sin with Model::rope's tables [N, hd] (sin signed: (-sin, sin)), or
// its transpose (the backward: the sin table's halves swapped).
struct RopeArgs {
  const float* x;
  float* out;
  const float *cos, *sin;
  int64_t xStride, outStride, N, H, hd;
  bool transpose;
};
// SwiGLU: out [N, I] = silu(gate) up, gate and up rows `ldg` / `ldu` apart (the halves of one
// packed projection, or two tensors). Backward from grad [N, I]: dGate = grad up s (1 + gate (1 -
// s)), dUp = grad gate s, s = sigmoid(gate), into rows `ldd` apart.
struct SwigluArgs {
  const float *gate, *up, *grad;
  float *out, *dGate, *dUp;
  int64_t ldg, ldu, ldd, N, I;
};
using BlockNormFn = void (*)(const NormArgs&);
using BlockNormBackwardFn = void (*)(const NormBackwardArgs&);
using BlockRopeFn = void (*)(const RopeArgs&);
using BlockSwigluFn = void (*)(const SwigluArgs&);

struct Kernels {
  const char* isa;  // "default", "avx2" or "avx512": the instruction set these were compiled for
  PagedAttentionFn pagedAttentionF32, pagedAttentionBF16;
  LinearFn linearF32, linearBF16;
  LmHeadRowsFn lmHeadForwardF32, lmHeadBackwardF32;
  SampleRowFn sampleRowF32;
  DeltaStepFn deltaStepF32;
  BlockNormFn rmsNormF32;
  BlockNormBackwardFn rmsNormBackwardF32;
  BlockRopeFn ropeF32;
  BlockSwigluFn swigluF32, swigluBackwardF32;
};

// The kernels for this CPU (chosen once).
const Kernels& kernels();
// The copy compiled for `isa` ("default", "avx2", "avx512") when this CPU can run it, else null:
// what cpuKernelCheck runs each of.
const Kernels* kernelsFor(const std::string& isa);

}  // namespace prime::cpu
