#include "adamw.h"

#include "host_parallel.h"

#include <torch/version.h>

#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

namespace prime {
namespace {

struct Coefficients {
  double decay, beta1, beta2, gradScale, stepSize, sqrtBc2, eps;
};

template <typename S>
void fusedUpdate(S* p, const S* g, S* m, S* v, int64_t n, const Coefficients& k) {
  const S decay = S(k.decay), b1 = S(k.beta1), b2 = S(k.beta2), c1 = S(1 - k.beta1), c2 = S(1 - k.beta2);
  const S scale = S(k.gradScale), stepSize = S(k.stepSize), sqrtBc2 = S(k.sqrtBc2), eps = S(k.eps);
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const S gi = g[i] * scale;
    const S mi = m[i] * b1 + gi * c1;
    const S vi = v[i] * b2 + gi * gi * c2;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - stepSize * (mi / (std::sqrt(vi) / sqrtBc2 + eps));
  }
}

// fusedUpdate over a parameter in parts on the host threads (element-wise: the result does not
// depend on the split). Parts of at least 64K elements: a small tensor is one part.
template <typename S>
void fusedUpdateParallel(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, const Coefficients& k) {
  S *pp = p.data_ptr<S>(), *mp = m.data_ptr<S>(), *vp = v.data_ptr<S>();
  const S* gp = g.data_ptr<S>();
  hostParallelFor(p.numel(), int64_t(1) << 16,
                  [&](int64_t a, int64_t b) { fusedUpdate(pp + a, gp + a, mp + a, vp + a, b - a, k); });
}

// The same update as tensor ops: parameters on another device (CUDA: no host pointers, no host
// round trip), or a layout the loop above cannot walk.
void tensorUpdate(at::Tensor& p, const at::Tensor& g0, at::Tensor& m, at::Tensor& v, const Coefficients& k) {
  const at::Tensor g = k.gradScale == 1.0 ? g0 : g0 * k.gradScale;
  p.mul_(k.decay);
  m.mul_(k.beta1).add_(g, 1 - k.beta1);
  v.mul_(k.beta2).addcmul_(g, g, 1 - k.beta2);
  p.addcdiv_(m, (v.sqrt() / k.sqrtBc2).add_(k.eps), -k.stepSize);
}

// Parameters of one device and step count, updated together on a GPU.
struct FusedBatch {
  std::vector<at::Tensor> p, g, m, v;
};

// CUDA fp32 parameters under libtorch 2.x: its fused AdamW (multi-tensor apply: a few kernels for
// all of them, each value read and written once, where tensorUpdate launches nine kernels per
// parameter). The same update; the clipping scale is applied as the kernel's grad_scale (a
// divisor), which may leave the clipped gradients in .grad.
bool fusable(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return p.is_cuda() && p.scalar_type() == at::kFloat && g.scalar_type() == at::kFloat &&
         m.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat && g.device() == p.device();
#else
  return false;
#endif
}

void multiTensorUpdate(std::map<std::pair<int64_t, int>, FusedBatch>& batches, const torch::optim::AdamWOptions& o,
                       double gradScale) {
#if TORCH_VERSION_MAJOR >= 2
  for (auto& [key, b] : batches) {
    const auto f32 = b.p.front().options().dtype(at::kFloat);
    // Filled on the device: no host-to-device copy.
    const std::vector<at::Tensor> steps(b.p.size(), at::full({}, double(key.first), f32));
    std::optional<at::Tensor> scale;
    if (gradScale != 1.0) scale = at::full({}, 1.0 / gradScale, f32);
    const auto [beta1, beta2] = o.betas();
    at::_fused_adamw_(b.p, b.g, b.m, b.v, {}, steps, o.lr(), beta1, beta2, o.weight_decay(), o.eps(),
                      /*amsgrad=*/false, /*maximize=*/false, scale, std::nullopt);
  }
#endif
}

}  // namespace

void adamwStep(torch::optim::AdamW& opt, double gradScale) {
  at::NoGradGuard noGrad;
  for (auto& group : opt.param_groups()) {
    std::map<std::pair<int64_t, int>, FusedBatch> fused;  // by step count and device
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    if (o.amsgrad()) throw std::runtime_error("adamwStep: amsgrad is not supported");
    const auto [beta1, beta2] = o.betas();
    for (at::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& g = p.grad();
      auto& slot = opt.state()[stateKey(opt.state(), p)];
      if (!slot) {
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(0);
        st->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        st->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(st);
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*slot);
      st.step(st.step() + 1);
      const double bc1 = 1 - std::pow(beta1, double(st.step())), bc2 = 1 - std::pow(beta2, double(st.step()));
      const Coefficients k{
          1 - o.lr() * o.weight_decay(), beta1, beta2, gradScale, o.lr() / bc1, std::sqrt(bc2), o.eps()};
      at::Tensor &m = st.exp_avg(), &v = st.exp_avg_sq();
      if (fusable(p, g, m, v)) {
        FusedBatch& b = fused[{st.step(), int(p.device().index())}];
        b.p.push_back(p), b.g.push_back(g), b.m.push_back(m), b.v.push_back(v);
        continue;
      }
      const bool flat = p.is_contiguous() && g.is_contiguous() && m.is_contiguous() && v.is_contiguous() &&
                        g.scalar_type() == p.scalar_type() && m.scalar_type() == p.scalar_type() &&
                        v.scalar_type() == p.scalar_type() && p.device().is_cpu();
      if (flat && p.scalar_type() == at::kFloat) fusedUpdateParallel<float>(p, g, m, v, k);
      else if (flat && p.scalar_type() == at::kDouble) fusedUpdateParallel<double>(p, g, m, v, k);
      else tensorUpdate(p, g, m, v, k);
    }
    multiTensorUpdate(fused, o, gradScale);
  }
}

}  // namespace prime
