#include "lm_head.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace prime {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Logits / T of one chunk, as the unfused path computed them (in place: no second buffer).
at::Tensor chunkLogits(const at::Tensor& h, const at::Tensor& w, double temperature, at::ScalarType dt) {
  at::Tensor z = at::linear(h, w).to(dt);
  return temperature == 1.0 ? z : z.div_(temperature);
}

struct ChunkedLmHead : torch::autograd::Function<ChunkedLmHead> {
  // `keepChunks`: how many leading chunks keep their log-softmax for the backward (the rest are
  // recomputed there from hidden and weight).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                               const at::Tensor& targets, double temperature, int64_t logitsDtype, int64_t chunk,
                               int64_t keepChunks) {
    const auto dt = static_cast<at::ScalarType>(logitsDtype);
    const int64_t N = hidden.size(0);
    at::Tensor logp = at::empty({N}, hidden.options().dtype(dt)), entropy = at::empty_like(logp);
    std::vector<at::Tensor> kept;
    for (int64_t a = 0, c = 0; a < N; a += chunk, ++c) {
      const int64_t len = std::min(chunk, N - a);
      at::Tensor lp = at::log_softmax(chunkLogits(hidden.narrow(0, a, len), weight, temperature, dt), -1);
      logp.narrow(0, a, len).copy_(lp.gather(1, targets.narrow(0, a, len).unsqueeze(1)).squeeze(1));
      entropy.narrow(0, a, len).copy_(-(lp.exp() * lp).sum(-1));
      if (c < keepChunks) kept.push_back(lp);
    }
    kept.insert(kept.begin(), {hidden, weight, targets, entropy});
    ctx->save_for_backward(kept);
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["dtype"] = logitsDtype;
    ctx->saved_data["chunk"] = chunk;
    return {logp, entropy};
  }

  // With z = logits / T, p = softmax(z), H = -sum p log p:
  //   d logp_t / dz_j = [j = t] - p_j,   dH / dz_j = -p_j (log p_j + H).
  // So dL/dz = gLogp ([j = t] - p) - gEnt p (log p + H), and dL/dlogits = dL/dz / T.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &targets = saved[2], &entropy = saved[3];
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const auto dt = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const bool wantHidden = ctx->needs_input_grad(0), wantWeight = ctx->needs_input_grad(1);
    at::Tensor gLogp = grads[0], gEnt = grads[1];  // materialised: zeros when an output was unused
    at::Tensor gHidden = wantHidden ? at::empty_like(hidden) : at::Tensor();
    at::Tensor gWeight = wantWeight ? at::empty_like(weight) : at::Tensor();  // first chunk: beta = 0
    // Unused outputs get zero gradients: skip the entropy terms when nothing uses the entropy.
    const bool entropyGrad = gEnt.defined() && gEnt.ne(0).any().item<bool>();
    const int64_t N = hidden.size(0), chunk = ctx->saved_data["chunk"].toInt();
    for (int64_t a = 0; a < N && (wantHidden || wantWeight); a += chunk) {
      const int64_t len = std::min(chunk, N - a);
      const at::Tensor h = hidden.narrow(0, a, len);
      const at::Tensor gl = gLogp.narrow(0, a, len).unsqueeze(1);
      const at::Tensor ge = entropyGrad ? gEnt.narrow(0, a, len).unsqueeze(1) : at::Tensor();
      // A kept chunk's log-softmax is reused (and consumed: the backward runs once); the others are
      // recomputed, one LM-head matmul each.
      const size_t c = size_t(a / chunk);
      at::Tensor lp = 4 + c < saved.size() ? saved[4 + c] : at::Tensor(), g;
      if (entropyGrad) {
        // In place: -(p (gEnt (log p + H) + gLogp)).
        if (!lp.defined()) lp = at::log_softmax(chunkLogits(h, weight, temperature, dt), -1);
        at::Tensor p = lp.exp();
        g = lp.add_(entropy.narrow(0, a, len).unsqueeze(1)).mul_(ge).add_(gl).mul_(p).neg_();
      } else if (lp.defined()) {
        g = lp.exp_().mul_(-gl);  // the usual case: entropy is a metric, its gradient 0
      } else {
        g = at::softmax(chunkLogits(h, weight, temperature, dt), -1).mul_(-gl);
      }
      g.scatter_add_(1, targets.narrow(0, a, len).unsqueeze(1), gl);  // + gLogp at the target
      const at::Tensor gw = g.to(weight.scalar_type());
      // 1 / T folded into the two products (dL/dlogits = dL/dz / T).
      if (wantHidden) {
        at::Tensor gh = gHidden.narrow(0, a, len);
        at::mm_out(gh, gw, weight).div_(temperature);
      }
      if (wantWeight) gWeight.addmm_(gw.t(), h, a == 0 ? 0.0 : 1.0, 1.0 / temperature);
    }
    return {gHidden, gWeight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t lmHeadChunkTokens(int64_t vocab) {
  return std::clamp<int64_t>((int64_t(1) << 25) / std::max<int64_t>(vocab, 1), 16, 1024);
}

TokenStats chunkedTokenStats(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                             double temperature, at::ScalarType logitsDtype, int64_t chunkTokens, int64_t keepBytes) {
  if (chunkTokens < 0) throw std::runtime_error("logitsChunkTokens must be >= 0 (0 = from the vocabulary size)");
  if (keepBytes < 0) throw std::runtime_error("logitsKeepBytes must be >= 0");
  const int64_t chunk = chunkTokens > 0 ? chunkTokens : lmHeadChunkTokens(weight.size(0));
  // Keep log-softmax chunks only when a backward will use them (not when scoring without grad).
  const bool backward = at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  const int64_t chunkBytes = chunk * weight.size(0) * int64_t(c10::elementSize(logitsDtype));
  const int64_t keepChunks = backward ? keepBytes / std::max<int64_t>(chunkBytes, 1) : 0;
  variable_list out =
      ChunkedLmHead::apply(hidden, weight, targets, temperature, int64_t(logitsDtype), chunk, keepChunks);
  return {out[0], out[1]};
}

}  // namespace prime
