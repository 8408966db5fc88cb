// AdamW's step as one pass over each parameter, on the state of a torch::optim::AdamW (which keeps
// holding it: checkpoints, ZeRO-1 shards and the gathered optimizer read it as before).
#pragma once

#include <torch/optim/adamw.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace prime {

// The key of a parameter in an optimizer's state map: its TensorImpl, as a string in libtorch
// 1.13 and as the pointer itself in 2.x.
template <typename Map>
typename Map::key_type stateKey(const Map&, const at::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << static_cast<const void*>(p.unsafeGetTensorImpl());
    return s.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// The AdamW state of `p` in `opt`, or null.
inline torch::optim::AdamWParamState* adamState(torch::optim::AdamW& opt, const at::Tensor& p) {
  auto it = opt.state().find(stateKey(opt.state(), p));
  return it == opt.state().end() ? nullptr : static_cast<torch::optim::AdamWParamState*>(it->second.get());
}

// Gives `p` the AdamW state (step, exp_avg m, exp_avg_sq v) in `opt`.
inline void setAdamState(torch::optim::AdamW& opt, const at::Tensor& p, int64_t step, at::Tensor m, at::Tensor v) {
  auto st = std::make_unique<torch::optim::AdamWParamState>();
  st->step(step);
  st->exp_avg(std::move(m));
  st->exp_avg_sq(std::move(v));
  opt.state()[stateKey(opt.state(), p)] = std::move(st);
}

// What opt.step() does (libtorch's AdamW without amsgrad: decoupled weight decay, bias-corrected
// moments, state created as zeros on a parameter's first step), with every gradient multiplied by
// gradScale first (the clipping coefficient; on the CPU the gradients themselves are left as they
// are, on CUDA they may be left clipped). libtorch runs it as eight tensor ops per parameter, each
// a pass over memory and, at 100M parameters, a tenth of a training step; here each contiguous CPU
// parameter is one pass reading p, g, m, v and writing p, m, v, and CUDA fp32 parameters (libtorch
// 2.x) go through its fused multi-tensor AdamW, a few kernels for all of them. Parameters without
// a gradient are skipped, as libtorch skips them.
void adamwStep(torch::optim::AdamW& opt, double gradScale = 1.0);

}  // namespace prime
