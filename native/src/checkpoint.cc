#include "checkpoint.h"

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>  // torch::CustomClassHolder, capsules
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

#include "autocast.h"

namespace prime {

namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the backward needs to run the layer again (held by the autograd graph in a capsule).
struct Rerun : torch::CustomClassHolder {
  std::function<at::Tensor(const at::Tensor&)> layer;
  at::Generator* rng = nullptr;
  at::Tensor rngState;  // the generator's state before the forward drew from it
  std::optional<at::ScalarType> autocast;
  at::Device device{at::kCPU};
};

struct Checkpoint : torch::autograd::Function<Checkpoint> {
  // `anchor` requires grad, so the output does even when x does not (the first layer's input under
  // LoRA, with the embedding frozen): the layer's own parameters still get their gradients.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                               c10::intrusive_ptr<Rerun> rerun) {
    ctx->save_for_backward({x});
    at::Tensor y = rerun->layer(x);  // grad mode is off in a custom function's forward
    ctx->saved_data["rerun"] = c10::IValue::make_capsule(std::move(rerun));
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto rerun = c10::static_intrusive_pointer_cast<Rerun>(ctx->saved_data["rerun"].toCapsule());
    at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(ctx->needs_input_grad(0));
    at::Tensor y;
    {
      at::AutoGradMode grad(true);
      const AutocastGuard autocast(rerun->device, rerun->autocast);
      at::Tensor now;
      if (rerun->rng) {
        now = rerun->rng->get_state();
        rerun->rng->set_state(rerun->rngState);
      }
      y = rerun->layer(x);
      if (rerun->rng) rerun->rng->set_state(now);  // the stream goes on where the forward left it
    }
    // Reentrant: accumulates the layer's parameter gradients and x's.
    torch::autograd::backward({y}, {grads[0]});
    return {x.requires_grad() ? x.grad() : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
}  // namespace

at::Tensor checkpointed(const at::Tensor& x, std::function<at::Tensor(const at::Tensor&)> layer, at::Generator* rng) {
  auto rerun = c10::make_intrusive<Rerun>();
  rerun->layer = std::move(layer);
  rerun->rng = rng;
  if (rng) rerun->rngState = rng->get_state();
  rerun->device = x.device();
  rerun->autocast = AutocastGuard::active(x.device());
  const at::Tensor anchor = at::zeros({}, x.options().dtype(at::kFloat)).requires_grad_(true);
  return Checkpoint::apply(x, anchor, rerun)[0];
}

}  // namespace prime
