#include "lm_head.h"

#include "autocast.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_kernels.h"
#include "grad_into.h"
#include "host_parallel.h"
#include "kernels.h"
#include "lm_head_rows.h"

namespace prime {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- Row kernels: each row of logits is read twice in the forward, once in the backward --------
// lm_head_rows.h has them and their formulas; fp32 rows run the copy compiled for this CPU's
// instruction set (cpu_kernels.h), fp64 rows the one included here.

// a @ b in `out` dtype. A bf16 product into fp32 on CUDA comes straight out of the GEMM (libtorch
// 2.x's mm with out_dtype: fp32 accumulation, no bf16 rounding of the result, no cast pass);
// elsewhere the product is cast.
at::Tensor mmTo(const at::Tensor& a, const at::Tensor& b, at::ScalarType out) {
#if TORCH_VERSION_MAJOR >= 2
  if (a.is_cuda() && a.scalar_type() != out && (a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf) &&
      out == at::kFloat)
    return at::mm(a, b, out);
#endif
  return at::mm(a, b).to(out);
}

// acc += alpha a @ b, acc fp32 and a, b bf16 (mixed precision). On CUDA with libtorch 2.11's
// addmm with an out_dtype: the GEMM accumulates into acc itself (fp32 accumulation, beta 1), with
// no product tensor: at a 151,936-token vocabulary and hidden 1,024 a [vocab, hidden] fp32 product
// is 622 MB per chunk. Elsewhere the product is cast and added.
void addmmTo(at::Tensor& acc, const at::Tensor& a, const at::Tensor& b, double alpha) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
  if (acc.is_cuda() && acc.scalar_type() == at::kFloat &&
      (a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf)) {
    at::addmm_out(acc, acc, a, b, at::kFloat, 1.0, alpha);
    return;
  }
#endif
  acc.add_(mmTo(a, b, acc.scalar_type()), alpha);
}

// Raw logits of one chunk in the logits dtype (the 1 / T is applied by the row kernels). The
// matmul runs in `mm` (bf16 under mixed precision: autocast.h), cast explicitly so the backward's
// recomputation, which runs outside the forward's autocast region, gives the same logits.
at::Tensor chunkLogits(const at::Tensor& h, const at::Tensor& w, at::ScalarType dt, at::ScalarType mm) {
  return mmTo(h.to(mm), w.t(), dt);
}

template <typename S>
void forwardRows(const at::Tensor& z, const at::Tensor& targets, double temperature, at::Tensor& logp,
                 at::Tensor& entropy, at::Tensor& logZ) {
  const int64_t n = z.size(0), V = z.size(1);
  const int64_t* t = targets.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; r++)  // what gather would refuse (the rows are read by pointer)
    if (t[r] < 0 || t[r] >= V)
      throw std::runtime_error("LM head: target token " + std::to_string(t[r]) + " is outside the vocabulary of " +
                               std::to_string(V));
  RECORD_USER_SCOPE("prime::lm_head_rows_forward");  // named in a profiled step (profile.h)
  cpu::LmHeadRows<S> a{
      z.data_ptr<S>(),       t,       n,      V, S(1.0 / temperature), logZ.data_ptr<double>(), logp.data_ptr<S>(),
      entropy.data_ptr<S>(), nullptr, nullptr};
  if constexpr (std::is_same_v<S, float>) cpu::kernels().lmHeadForwardF32(a);
  else hostParallelFor(n, rowsGrain(V), [&](int64_t r0, int64_t r1) { forwardRowRange(a, r0, r1); });
}

template <typename S>
void backwardRows(at::Tensor& z, const at::Tensor& targets, double temperature, const at::Tensor& logZ,
                  const at::Tensor& entropy, const at::Tensor& gLogp, const at::Tensor& gEnt) {
  const int64_t n = z.size(0), V = z.size(1);
  RECORD_USER_SCOPE("prime::lm_head_rows_backward");
  cpu::LmHeadRows<S> a{z.data_ptr<S>(),
                       targets.data_ptr<int64_t>(),
                       n,
                       V,
                       S(1.0 / temperature),
                       logZ.data_ptr<double>(),
                       nullptr,
                       entropy.data_ptr<S>(),
                       gLogp.data_ptr<S>(),
                       gEnt.defined() ? gEnt.data_ptr<S>() : nullptr};
  if constexpr (std::is_same_v<S, float>) cpu::kernels().lmHeadBackwardF32(a);
  else hostParallelFor(n, rowsGrain(V), [&](int64_t r0, int64_t r1) { backwardRowRange(a, r0, r1); });
}

// The same quantities as tensor ops, for logits on another device (CUDA): no host pointers, no
// host round trip, and few passes over the chunk (each a trip through device memory): one fused
// log-softmax, one exp, one product and its sum.
void forwardRowsOps(const at::Tensor& z, const at::Tensor& targets, double temperature, at::Tensor& logp,
                    at::Tensor& entropy, at::Tensor& logZ) {
  const at::Tensor x = temperature == 1.0 ? z : z / temperature, t = targets.unsqueeze(1);
  const at::Tensor lp = at::log_softmax(x, 1), lpt = lp.gather(1, t);
  logp.copy_(lpt.squeeze(1));
  logZ.copy_((x.gather(1, t) - lpt).squeeze(1));  // log Z = x_t - logp_t
  entropy.copy_(lp.exp().mul_(lp).sum(-1).neg_());
}

// dL/dx (x = z / T) of one chunk as tensor ops, in `out` (the dtype of the products that follow).
// Without an entropy gradient (the usual case) from the recomputed softmax: -gLogp (p - onehot(t)),
// scaled and cast in one pass.
at::Tensor backwardRowsOps(const at::Tensor& z, const at::Tensor& targets, double temperature, const at::Tensor& logZ,
                           const at::Tensor& entropy, const at::Tensor& gLogp, const at::Tensor& gEnt,
                           at::ScalarType out) {
  const at::Tensor t = targets.unsqueeze(1), gl = gLogp.unsqueeze(1);
  if (!gEnt.defined()) {
    at::Tensor p = at::softmax(temperature == 1.0 ? z : z / temperature, 1);
    p.scatter_add_(1, t, at::full_like(gl, -1.0));
    if (out == p.scalar_type()) return p.mul_(gl.neg());
    at::Tensor g = at::empty(p.sizes(), p.options().dtype(out));
    return at::mul_out(g, p, gl.neg());
  }
  const at::Tensor lp = (z / temperature).sub_(logZ.to(z.scalar_type()).unsqueeze(1));
  at::Tensor g = lp.exp().mul_(-(gEnt.unsqueeze(1) * (lp + entropy.unsqueeze(1)) + gl));
  return g.scatter_add_(1, t, gl).to(out);
}

// Our CUDA row kernels: fp32 logits on a CUDA device, when asked for.
bool fusedRows(const at::Tensor& z, LmHeadKernels kernels) {
  return kernels == LmHeadKernels::Fused && z.is_cuda() && z.scalar_type() == at::kFloat;
}

void forwardChunk(const at::Tensor& z, const at::Tensor& targets, double temperature, at::Tensor logp,
                  at::Tensor entropy, at::Tensor logZ, LmHeadKernels kernels) {
  const bool ops = kernels == LmHeadKernels::TensorOps;
  if (fusedRows(z, kernels)) fusedLmHeadForward(z, targets, temperature, logp, entropy, logZ);
  else if (ops || !z.device().is_cpu()) forwardRowsOps(z, targets, temperature, logp, entropy, logZ);
  else if (z.scalar_type() == at::kDouble) forwardRows<double>(z, targets, temperature, logp, entropy, logZ);
  else forwardRows<float>(z, targets, temperature, logp, entropy, logZ);
}

// dL/dx of one chunk in `out`: the CPU row kernels overwrite the logits z in place (then a cast);
// tensor ops make a new tensor.
at::Tensor backwardChunk(at::Tensor& z, const at::Tensor& targets, double temperature, const at::Tensor& logZ,
                         const at::Tensor& entropy, const at::Tensor& gLogp, const at::Tensor& gEnt,
                         LmHeadKernels kernels, at::ScalarType out) {
  if (fusedRows(z, kernels)) return fusedLmHeadBackward(z, targets, temperature, logZ, entropy, gLogp, gEnt, out);
  if (kernels == LmHeadKernels::TensorOps || !z.device().is_cpu())
    return backwardRowsOps(z, targets, temperature, logZ, entropy, gLogp, gEnt, out);
  if (z.scalar_type() == at::kDouble) backwardRows<double>(z, targets, temperature, logZ, entropy, gLogp, gEnt);
  else backwardRows<float>(z, targets, temperature, logZ, entropy, gLogp, gEnt);
  return z.to(out);
}

struct ChunkedLmHead : torch::autograd::Function<ChunkedLmHead> {
  // `keepChunks`: how many leading chunks keep their logits for the backward (the rest are
  // recomputed there from hidden and weight). `kernels`: which row kernels (LmHeadKernels).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                               const at::Tensor& targets, double temperature, int64_t logitsDtype, int64_t chunk,
                               int64_t keepChunks, int64_t kernels) {
    const auto dt = static_cast<at::ScalarType>(logitsDtype);
    // Under mixed precision the LM head's matmuls run in the autocast dtype, forward and backward
    // alike; its weight stays fp32 and so does everything after the logits.
    const at::ScalarType mm = AutocastGuard::active(hidden.device()).value_or(weight.scalar_type());
    // bf16 copy of the weight made once per call, not once per chunk (no-op without autocast).
    const at::Tensor w = weight.to(mm);
    const int64_t N = hidden.size(0);
    const at::Tensor t = targets.contiguous();
    at::Tensor logp = at::empty({N}, hidden.options().dtype(dt)), entropy = at::empty_like(logp);
    at::Tensor logZ = at::empty({N}, hidden.options().dtype(at::kDouble));
    std::vector<at::Tensor> kept;
    for (int64_t a = 0, c = 0; a < N; a += chunk, ++c) {
      const int64_t len = std::min(chunk, N - a);
      at::Tensor z = chunkLogits(hidden.narrow(0, a, len), w, dt, mm);
      forwardChunk(z, t.narrow(0, a, len), temperature, logp.narrow(0, a, len), entropy.narrow(0, a, len),
                   logZ.narrow(0, a, len), static_cast<LmHeadKernels>(kernels));
      if (c < keepChunks) kept.push_back(z);
    }
    kept.insert(kept.begin(), {hidden, weight, t, entropy, logZ});
    ctx->save_for_backward(kept);
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["dtype"] = logitsDtype;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["kernels"] = kernels;
    ctx->saved_data["mm"] = int64_t(mm);
    // On the CPU the weight's gradient is added into the parameter's own .grad by the products of
    // the backward themselves (gradAccumulator below): the weight is a leaf parameter and the
    // products run in its dtype. Tensor ops (other devices' path) return it, as autograd expects.
    ctx->saved_data["intoGrad"] = weight.is_leaf() && weight.requires_grad() && weight.device().is_cpu() &&
                                  static_cast<LmHeadKernels>(kernels) != LmHeadKernels::TensorOps &&
                                  mm == weight.scalar_type() && hidden.scalar_type() == weight.scalar_type();
    // An unused output's gradient arrives undefined rather than as zeros: whether the entropy's
    // terms are needed is then known without reading the gradient on the host.
    ctx->set_materialize_grads(false);
    return {logp, entropy};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &targets = saved[2], &entropy = saved[3], &logZ = saved[4];
    constexpr size_t kFirstKept = 5;
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const auto dt = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const bool wantHidden = ctx->needs_input_grad(0), wantWeight = ctx->needs_input_grad(1);
    const at::Tensor gLogp = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(entropy);
    // Skip the entropy terms when nothing uses the entropy.
    const bool entropyGrad = grads[1].defined();
    const at::Tensor gEnt = entropyGrad ? grads[1].contiguous() : at::Tensor();
    at::Tensor gHidden = wantHidden ? at::empty_like(hidden) : at::Tensor();
    // The weight's gradient: the parameter's .grad itself where it can take the products (they add
    // into it), else a fresh tensor returned to autograd. `beta0`: the first product overwrites
    // (a fresh tensor) rather than adds.
    at::Tensor gWeight;
    bool intoGrad = false, beta0 = true;
    if (wantWeight && ctx->saved_data["intoGrad"].toBool()) {
      GradAccumulator acc = gradAccumulator(weight, /*allocate=*/true);
      if (acc.grad.defined()) gWeight = acc.grad, intoGrad = true, beta0 = acc.fresh;
    }
    if (wantWeight && !intoGrad) gWeight = at::empty_like(weight);
    const int64_t N = hidden.size(0), chunk = ctx->saved_data["chunk"].toInt();
    const auto kernels = static_cast<LmHeadKernels>(ctx->saved_data["kernels"].toInt());
    const auto mm = static_cast<at::ScalarType>(ctx->saved_data["mm"].toInt());
    const at::Tensor w = weight.to(mm);  // once per call, as in the forward
    for (int64_t a = 0; a < N && (wantHidden || wantWeight); a += chunk) {
      const int64_t len = std::min(chunk, N - a);
      const at::Tensor h = hidden.narrow(0, a, len);
      // A kept chunk's logits are reused (and consumed: the backward runs once); the others are
      // recomputed, one LM-head matmul each.
      const size_t c = size_t(a / chunk);
      at::Tensor g = kFirstKept + c < saved.size() ? saved[kFirstKept + c] : chunkLogits(h, w, dt, mm);
      const at::Tensor t = targets.narrow(0, a, len), lz = logZ.narrow(0, a, len), ent = entropy.narrow(0, a, len);
      const at::Tensor gl = gLogp.narrow(0, a, len), ge = entropyGrad ? gEnt.narrow(0, a, len) : at::Tensor();
      const at::Tensor gw = backwardChunk(g, t, temperature, lz, ent, gl, ge, kernels, mm);
      // 1 / T folded into the two products (dL/dlogits = dL/dz / T).
      if (mm == weight.scalar_type() && mm == hidden.scalar_type()) {
        if (wantHidden) {
          at::Tensor gh = gHidden.narrow(0, a, len);
          at::mm_out(gh, gw, weight).div_(temperature);
        }
        if (wantWeight) gWeight.addmm_(gw.t(), h, a == 0 && beta0 ? 0.0 : 1.0, 1.0 / temperature);
      } else {
        // Mixed precision: bf16 products, accumulated into the fp32 gradients (on CUDA the weight's
        // comes out of its GEMM in fp32: mmTo).
        if (wantHidden) {
          at::Tensor gh = gHidden.narrow(0, a, len).copy_(at::mm(gw, w));
          if (temperature != 1.0) gh.div_(temperature);
        }
        if (wantWeight) {
          if (a == 0) {
            gWeight = mmTo(gw.t(), h.to(mm), weight.scalar_type());  // a fresh fp32 tensor: the gradient
            if (temperature != 1.0) gWeight.div_(temperature);
          } else {
            addmmTo(gWeight, gw.t(), h.to(mm), 1.0 / temperature);
          }
        }
      }
    }
    if (intoGrad && beta0 && N == 0) gWeight.zero_();  // allocated, and no product wrote it
    return {gHidden,      intoGrad ? at::Tensor() : gWeight,
            at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t lmHeadChunkTokens(int64_t vocab, const at::Device& device) {
  const int64_t logits = device.is_cpu() ? int64_t(1) << 25 : int64_t(1) << 28;
  return std::clamp<int64_t>(logits / std::max<int64_t>(vocab, 1), 16, device.is_cpu() ? 1024 : 8192);
}

TokenStats chunkedTokenStats(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                             double temperature, at::ScalarType logitsDtype, int64_t chunkTokens, int64_t keepBytes,
                             LmHeadKernels kernels) {
  if (chunkTokens < 0) throw std::runtime_error("logitsChunkTokens must be >= 0 (0 = from the vocabulary size)");
  if (keepBytes < 0) throw std::runtime_error("logitsKeepBytes must be >= 0");
  if (logitsDtype != at::kFloat && logitsDtype != at::kDouble)
    throw std::runtime_error("the LM head's logits are fp32 or fp64, not " + std::string(c10::toString(logitsDtype)));
  int64_t chunk = chunkTokens > 0 ? chunkTokens : lmHeadChunkTokens(weight.size(0), hidden.device());
  // Keep logits chunks only when a backward will use them (not when scoring without grad).
  const bool backward = at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  const int64_t tokenBytes = weight.size(0) * int64_t(c10::elementSize(logitsDtype));
  // On the CPU a row whose logits the budget keeps whole is one chunk (kept, so no more memory
  // than its chunks kept one by one): one LM-head product over all its tokens forward, and in the
  // backward one pass over the [vocab, hidden] weight gradient instead of one per chunk.
  if (chunkTokens == 0 && backward && hidden.device().is_cpu() && hidden.size(0) * tokenBytes <= keepBytes)
    chunk = std::max(chunk, hidden.size(0));
  const int64_t chunkBytes = chunk * tokenBytes;
  const int64_t keepChunks = backward ? keepBytes / std::max<int64_t>(chunkBytes, 1) : 0;
  variable_list out = ChunkedLmHead::apply(hidden, weight, targets, temperature, int64_t(logitsDtype), chunk,
                                           keepChunks, int64_t(kernels));
  return {out[0], out[1]};
}

}  // namespace prime
