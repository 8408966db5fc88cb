#include "adamw.h"

#include "host_parallel.h"

#include <cmath>
#include <memory>
#include <stdexcept>

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

}  // namespace

void adamwStep(torch::optim::AdamW& opt, double gradScale) {
  at::NoGradGuard noGrad;
  for (auto& group : opt.param_groups()) {
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
      const bool flat = p.is_contiguous() && g.is_contiguous() && m.is_contiguous() && v.is_contiguous() &&
                        g.scalar_type() == p.scalar_type() && m.scalar_type() == p.scalar_type() &&
                        v.scalar_type() == p.scalar_type() && p.device().is_cpu();
      if (flat && p.scalar_type() == at::kFloat) fusedUpdateParallel<float>(p, g, m, v, k);
      else if (flat && p.scalar_type() == at::kDouble) fusedUpdateParallel<double>(p, g, m, v, k);
      else tensorUpdate(p, g, m, v, k);
    }
  }
}

}  // namespace prime
