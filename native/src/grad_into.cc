#include "grad_into.h"

#include <ATen/core/grad_mode.h>  // at::GradMode (not pulled in by ATen.h in libtorch 2.x)
#include <torch/csrc/autograd/custom_function.h>

namespace prime {

GradAccumulator gradAccumulator(const at::Tensor& param, bool allocate) {
  GradAccumulator out;
  if (!param.is_leaf() || !param.requires_grad() || at::GradMode::is_enabled()) return out;
  at::Tensor& g = param.mutable_grad();
  if (!g.defined()) {
    if (!allocate) return out;
    g = at::empty(param.sizes(), param.options());
    out.fresh = true;
  } else if (g.is_sparse() || !g.is_contiguous() || g.scalar_type() != param.scalar_type() ||
             g.sizes() != param.sizes() || g.device() != param.device() || g.requires_grad()) {
    return out;
  }
  out.grad = g;
  return out;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// grad[ids[i]] += g[i], rows in order (a token repeated adds in token order, on one thread).
template <typename S>
void addRows(at::Tensor& grad, const at::Tensor& g, const at::Tensor& ids) {
  const int64_t N = ids.size(0), D = grad.size(1);
  const int64_t* id = ids.data_ptr<int64_t>();
  const S* src = g.data_ptr<S>();
  S* dst = grad.data_ptr<S>();
  for (int64_t i = 0; i < N; i++) {
    S* row = dst + id[i] * D;
    const S* from = src + i * D;
#pragma omp simd
    for (int64_t d = 0; d < D; d++) row[d] += from[d];
  }
}

struct EmbeddingLookup : torch::autograd::Function<EmbeddingLookup> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& ids) {
    ctx->save_for_backward({weight, ids});
    return {at::embedding(weight, ids)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &weight = saved[0], &ids = saved[1];
    if (!ctx->needs_input_grad(0) || !grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const at::Tensor g = grads[0].contiguous();
    GradAccumulator acc = gradAccumulator(weight, /*allocate=*/false);
    const bool flat =
        g.scalar_type() == weight.scalar_type() && (g.scalar_type() == at::kFloat || g.scalar_type() == at::kDouble);
    if (!acc.grad.defined() || !flat)
      return {at::embedding_dense_backward(g, ids, weight.size(0), /*padding_idx=*/-1, /*scale_grad_by_freq=*/false),
              at::Tensor()};
    if (g.scalar_type() == at::kFloat) addRows<float>(acc.grad, g, ids);
    else addRows<double>(acc.grad, g, ids);
    return {at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor embeddingLookup(const at::Tensor& weight, const at::Tensor& ids) {
  if (!weight.device().is_cpu() || !weight.is_leaf() || !weight.requires_grad() || !at::GradMode::is_enabled() ||
      ids.dim() != 1 || weight.dim() != 2)
    return at::embedding(weight, ids);
  return EmbeddingLookup::apply(weight, ids.contiguous())[0];
}

}  // namespace prime
