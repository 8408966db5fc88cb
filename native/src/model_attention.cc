// Attention: the block's first half (q/k/v, q/k norm, RoPE), causal attention within a sample, and
// attention over the paged KV cache (the CPU kernels, and batched matmuls or the paged kernel on CUDA).
#include "model.h"

#include "cpu_kernels.h"
#include "cpu_matmul.h"
#include "host_parallel.h"
#include "paged_decode.h"

#include <torch/version.h>  // TORCH_VERSION_MAJOR: fused attention exists from 2.0

#include <chrono>
#include <cmath>
#include <limits>

// bmm with an out_dtype (bf16 inputs, fp32 scores): libtorch 2.11 has it (decodeAttentionBmm).
#define PRIME_BMM_OUT_DTYPE (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11))

namespace prime {
// Pre-attention half of a block: input norm, q/k/v projections, Qwen3 q/k norm, RoPE.
// Returns q [N, H, hd] and k [N, KV, hd]; v [N, KV, hd] through the out-parameter, and with the
// output gate (attnOutputGate, Qwen3.5) its pre-sigmoid values [N, H hd] through `gate`.
std::pair<at::Tensor, at::Tensor> Model::attentionInputs(const Layer& L, const at::Tensor& x, const at::Tensor& cos,
                                                         const at::Tensor& sin, at::Tensor& v, int64_t layer,
                                                         const Adapt& ad, at::Tensor* gate) const {
  const int64_t N = x.size(0), hd = cfg.headDim, H = cfg.numHeads, KV = cfg.numKvHeads;
  const int64_t qRows = L.q.size(0);  // H hd, or 2 H hd with the output gate
  at::Tensor h = rmsNorm(x, L.inputNorm);
  at::Tensor q, k;
  if (fusedUsable(L.qkv, {&L.q, &L.k, &L.v}, ad)) {
    // One matmul; q and k are rewritten below (norm, RoPE), v is made contiguous here. Split, not
    // three narrows: under autograd their gradients come back as one tensor (a cat), where each
    // narrow's backward would fill a full-width tensor with zeros and the three be added.
    const at::Tensor qkv = linearOn(h, L.qkv, L.qkvBias);  // [N, qRows + 2 KV hd]
    const std::vector<at::Tensor> parts = qkv.split_with_sizes({qRows, KV * hd, KV * hd}, 1);
    q = parts[0];
    k = parts[1].view({N, KV, hd});
    v = parts[2].contiguous().view({N, KV, hd});
  } else {
    q = project(h, L.q, L.qBias, ad);
    k = project(h, L.k, L.kBias, ad).view({N, KV, hd});
    v = project(h, L.v, L.vBias, ad).view({N, KV, hd});
  }
  if (cfg.attnOutputGate) {
    // Per head: hd query values, then hd gate values.
    const at::Tensor qg = q.reshape({N, H, 2 * hd});
    if (gate) *gate = qg.narrow(2, hd, hd).reshape({N, H * hd});
    q = qg.narrow(2, 0, hd);
  } else {
    q = q.view({N, H, hd});
  }
  if (L.qNorm.defined()) {
    q = rmsNorm(q, L.qNorm);
    k = rmsNorm(k, L.kNorm);
  }
  const int64_t rot = cfg.rotaryDim();
  if (rot == hd) return kernels().rope(q, k, cos, sin);  // non-interleaved RoPE (kernels.h)
  // Partial RoPE: the first `rot` dims of each head rotate, the others pass through.
  auto [qr, kr] = kernels().rope(q.narrow(2, 0, rot).contiguous(), k.narrow(2, 0, rot).contiguous(), cos, sin);
  return {at::cat({qr, q.narrow(2, rot, hd - rot)}, 2), at::cat({kr, k.narrow(2, rot, hd - rot)}, 2)};
}

// Causal attention within one sample: q [H, Lq, hd], k/v [KV, Lk, hd] -> [H, Lq, hd], query i at
// key position offset + i (a prefill chunk after `offset` cached positions).
at::Tensor Model::causalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t offset) const {
  const int64_t H = cfg.numHeads, KV = cfg.numKvHeads, G = H / KV;
  const int64_t Lq = q.size(1), Lk = k.size(1);
#if TORCH_VERSION_MAJOR >= 2
  // Fused kernel (flash / memory-efficient on CUDA). GQA: query head h reads kv head h / G.
  at::Tensor ke = k.repeat_interleave(G, 0), ve = v.repeat_interleave(G, 0);
  c10::optional<at::Tensor> mask;
  if (offset > 0)  // true where attention is allowed: key j <= offset + i
    mask = at::ones({Lq, Lk}, at::TensorOptions().dtype(at::kBool).device(device)).tril(offset);
  return at::scaled_dot_product_attention(q.unsqueeze(0), ke.unsqueeze(0), ve.unsqueeze(0), mask, 0.0,
                                          /*is_causal=*/offset == 0)
      .squeeze(0);
#else
  // Explicit path for libtorch 1.x. The G query heads sharing a kv head are stacked along the
  // row axis ([KV, G*Lq, hd]) so K and V are never copied per query head.
  const int64_t hd = cfg.headDim;
  at::Tensor qg = (q * (1.0 / std::sqrt(double(hd)))).reshape({KV, G * Lq, hd});
  at::Tensor s = at::matmul(qg, k.transpose(1, 2)).view({KV, G, Lq, Lk});
  at::Tensor future = at::ones({Lq, Lk}, at::TensorOptions().dtype(at::kBool).device(device)).triu(1 + offset);
  s = s.masked_fill(future, -std::numeric_limits<double>::infinity());
  at::Tensor p = at::softmax(s, -1, logitsDtype()).to(q.scalar_type()).view({KV, G * Lq, Lk});  // softmax in fp32
  return at::matmul(p, v).view({H, Lq, hd});
#endif
}

namespace {
// Attention over the paged cache on the CPU for fp64 models (fp32 and bf16 run cpu_kernels.h's
// vectorised kernel), one (token, kv head) at a time for the G query heads that share it, reading
// the blocks in place through the token's block table: each key and value row is read once for the
// G heads. q [N, H, hd]; caches [blocks, B, KV, hd]; token t attends to positions 0..pos[t] of table
// row seqOf[t]. Softmax in fp64; keys are visited in position order, as a contiguous cache would
// be, so the sums round the same whatever the blocks.
template <typename T>
void pagedAttentionKernel(const T* q, const T* k, const T* v, T* out, const int64_t* pos, const int64_t* seqOf,
                          const int64_t* tables, int64_t width, int64_t N, int64_t H, int64_t KV, int64_t hd,
                          int64_t B) {
  const int64_t G = H / KV, stride = KV * hd;  // stride: from one position to the next in a block
  const T scale = T(1.0 / std::sqrt(double(hd)));
  // Parts of at least 32 (token, kv head) pairs: a batch of one decodes on the calling thread.
  hostParallelFor(N * KV, 32, [&](int64_t begin, int64_t end) {
    std::vector<T> p, sums(static_cast<size_t>(G));  // p: [G, len] scores, then exp(score - max)
    for (int64_t i = begin; i < end; i++) {
      const int64_t t = i / KV, kvh = i % KV, len = pos[t] + 1;
      const int64_t* table = tables + seqOf[t] * width;
      const T* qg = q + (t * H + kvh * G) * hd;  // the group's G query heads, contiguous
      p.resize(size_t(G * len));
      for (int64_t s0 = 0; s0 < len; s0 += B) {
        const T* kb = k + (table[s0 / B] * B * KV + kvh) * hd;
        for (int64_t j = 0, m = std::min(B, len - s0); j < m; j++)
          for (int64_t g = 0; g < G; g++) {
            const T* qi = qg + g * hd;
            T dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < hd; d++) dot += qi[d] * kb[j * stride + d];
            p[g * len + s0 + j] = dot * scale;
          }
      }
      for (int64_t g = 0; g < G; g++) {
        T* pg = p.data() + g * len;
        const T mx = *std::max_element(pg, pg + len);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t s = 0; s < len; s++) sum += (pg[s] = std::exp(pg[s] - mx));
        sums[g] = sum;
      }
      T* o = out + (t * H + kvh * G) * hd;
      std::fill(o, o + G * hd, T(0));
      for (int64_t s0 = 0; s0 < len; s0 += B) {
        const T* vb = v + (table[s0 / B] * B * KV + kvh) * hd;
        for (int64_t j = 0, m = std::min(B, len - s0); j < m; j++)
          for (int64_t g = 0; g < G; g++) {
            const T w = p[g * len + s0 + j] / sums[g];
            T* og = o + g * hd;
#pragma omp simd
            for (int64_t d = 0; d < hd; d++) og[d] += w * vb[j * stride + d];
          }
      }
    }
  });
}

// Keys or values of table rows `tables` [n, width] gathered from a paged cache [blocks, B, KV, hd]
// into [n, KV, S, hd] (positions 0..S-1).
at::Tensor gatherBlocks(const at::Tensor& cache, const at::Tensor& tables, int64_t S) {
  const int64_t n = tables.size(0), B = cache.size(1), KV = cache.size(2), hd = cache.size(3);
  const int64_t nb = (S + B - 1) / B;
  return cache.index_select(0, tables.narrow(1, 0, nb).reshape({-1}))
      .view({n, nb * B, KV, hd})
      .narrow(1, 0, S)
      .permute({0, 2, 1, 3});
}
}  // namespace

at::Tensor Model::pagedAttention(const at::Tensor& q, const at::Tensor& kCache, const at::Tensor& vCache,
                                 const PagedBatch& batch) const {
  if (device.is_cpu()) {
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor o = pagedAttentionCpu(q, kCache, vCache, batch);
    if (batch.attentionSeconds)
      *batch.attentionSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return o;
  }
  // Elsewhere (CUDA, bf16 on the CPU): the decode rows together as batched matmuls over their
  // gathered blocks, each prefill chunk as causal attention over its sequence's gathered keys.
  std::vector<at::Tensor> outs;
  const int64_t n = batch.decodeRows;
  if (n > 0 && batch.decodeKernel)
    outs.push_back(pagedDecodeAttention(q.narrow(0, 0, n), kCache, vCache, batch.tables.narrow(0, 0, n),
                                        batch.pos.narrow(0, 0, n), batch.decodeKeys));
  else if (n > 0) outs.push_back(decodeAttentionBmm(q.narrow(0, 0, n), kCache, vCache, batch));
  int64_t row = n;
  for (size_t c = 0; c < batch.chunkStart.size(); c++) {
    const int64_t start = batch.chunkStart[c], len = batch.chunkLen[c];
    const at::Tensor table = batch.tables.narrow(0, n + int64_t(c), 1);
    const at::Tensor K = gatherBlocks(kCache, table, start + len).squeeze(0);  // [KV, start + len, hd]
    const at::Tensor V = gatherBlocks(vCache, table, start + len).squeeze(0);
    const at::Tensor qs = q.narrow(0, row, len).transpose(0, 1);  // [H, len, hd]
    outs.push_back(causalAttention(qs, K, V, start).transpose(0, 1));
    row += len;
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

// Decode attention on CUDA as two batched matmuls over the rows' gathered
// blocks: GQA groups the query heads as [n * KV, G, hd] against their kv head's keys [n * KV, S,
// hd]; scores and softmax in fp32, probabilities rounded to the compute dtype for the product
// with V (as flash attention does). Plain kernels whose shapes (n, decodeKeys) fix: capturable in
// a CUDA graph. Positions past a row's own (pos < s < S) are masked; the blocks they come from
// are the row's own or the null block, never NaN (the generator zeroes poisoned blocks), since
// masked probabilities still multiply V as 0 * v.
at::Tensor Model::decodeAttentionBmm(const at::Tensor& q, const at::Tensor& kCache, const at::Tensor& vCache,
                                     const PagedBatch& batch) const {
  const int64_t n = batch.decodeRows, S = batch.decodeKeys;
  const int64_t KV = cfg.numKvHeads, hd = cfg.headDim, G = cfg.numHeads / KV;
  const at::Tensor tables = batch.tables.narrow(0, 0, n);
  const at::Tensor K = gatherBlocks(kCache, tables, S).reshape({n * KV, S, hd}).transpose(1, 2);
  const at::Tensor V = gatherBlocks(vCache, tables, S).reshape({n * KV, S, hd});
  const at::Tensor qg = q.reshape({n * KV, G, hd});
  at::Tensor s;  // [n * KV, G, S], fp32 (fp64 for fp64 models)
  if (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble) {
    s = at::bmm(qg, K);
  } else {
#if PRIME_BMM_OUT_DTYPE
    if (q.is_cuda()) s = at::bmm(qg, K, at::kFloat);  // bf16 products summed into fp32 scores
#endif
    // bf16 on the CPU (bmm's out_dtype is CUDA's only), or an older libtorch: fp32 copies.
    if (!s.defined()) s = at::bmm(qg.to(at::kFloat), K.to(at::kFloat));
  }
  const auto longOpts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor visible =
      (at::arange(S, longOpts).unsqueeze(0) <= batch.pos.narrow(0, 0, n).unsqueeze(1)).view({n, 1, 1, S});
  s = s.mul_(1.0 / std::sqrt(double(hd)))
          .view({n, KV, G, S})
          .masked_fill_(visible.logical_not(), -std::numeric_limits<double>::infinity());
  const at::Tensor p = at::softmax(s, -1).to(q.scalar_type()).view({n * KV, G, S});
  return at::bmm(p, V).view({n, cfg.numHeads, hd});  // [n * KV, G, hd] = [n, H, hd]
}

at::Tensor Model::pagedAttentionCpu(const at::Tensor& q, const at::Tensor& kCache, const at::Tensor& vCache,
                                    const PagedBatch& batch) const {
  const at::Tensor qc = q.contiguous(), tables = batch.tables.contiguous();
  at::Tensor out = at::empty_like(qc);
  const cpu::PagedAttentionArgs args{qc.data_ptr(),
                                     kCache.data_ptr(),
                                     vCache.data_ptr(),
                                     out.data_ptr(),
                                     batch.pos.data_ptr<int64_t>(),
                                     batch.seqOf.data_ptr<int64_t>(),
                                     tables.data_ptr<int64_t>(),
                                     tables.size(1),
                                     q.size(0),
                                     cfg.numHeads,
                                     cfg.numKvHeads,
                                     cfg.headDim,
                                     kCache.size(1)};
  switch (q.scalar_type()) {
    case at::kFloat:
      cpu::kernels().pagedAttentionF32(args);
      break;
    case at::kBFloat16:
      cpu::kernels().pagedAttentionBF16(args);
      break;
    case at::kDouble:
      pagedAttentionKernel<double>(qc.data_ptr<double>(), kCache.data_ptr<double>(), vCache.data_ptr<double>(),
                                   out.data_ptr<double>(), args.pos, args.seqOf, args.tables, args.width, args.N,
                                   args.H, args.KV, args.hd, args.B);
      break;
    default:
      throw std::runtime_error(std::string("paged attention on the CPU: no kernel for ") +
                               c10::toString(q.scalar_type()));
  }
  return out;
}

}  // namespace prime
