#include "kernels.h"

#include "cpu_kernels.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#ifdef PRIME_HAVE_CUDA_KERNELS
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/kernels.h"
#endif
#include "cuda/norm_limits.h"

namespace prime {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- libtorch's ops: the reference ---------------------------------------------------------------

// Under mixed precision the weight is an fp32 master weight: cast to the activations' dtype
// (differentiable; its gradient returns in fp32), as a bf16 model's norm would hold it.
at::Tensor asActivation(const at::Tensor& w, const at::Tensor& x) {
  return w.scalar_type() == x.scalar_type() ? w : w.to(x.scalar_type());
}

class Unfused final : public BlockKernels {
 public:
  // HF's RMSNorm: variance in fp32 (fp64 for fp64 models), cast back to the input dtype, then
  // times the weight.
  at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) const override {
    const at::Tensor wx = asActivation(w, x);
#if TORCH_VERSION_MAJOR >= 2
    if (x.is_cuda()) {
      // libtorch 2.x's fused RMSNorm: one kernel forward, one backward, where the ops below are
      // eight and a dozen (an H100 profile of a 0.6B training step: 226 norms, each a trip through
      // memory per op). Its arithmetic is fp32 too; the normalised value is not rounded to the
      // input dtype before the weight multiplies it (one rounding, not two).
      return std::get<0>(at::_fused_rms_norm(x, {x.size(-1)}, wx, eps));
    }
#endif
    at::Tensor xf = x.to(x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
    at::Tensor y = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
    return wx * y.to(x.scalar_type());
  }

  std::pair<at::Tensor, at::Tensor> addRmsNorm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& w,
                                               double eps) const override {
    at::Tensor h = x + delta;
    return {h, rmsNorm(h, w, eps)};
  }

  // HF's x*cos + rotate_half(x)*sin with rotate_half(x) = (-x2, x1): the halves swapped (one flip)
  // times the signed sin table. The same roundings as HF's (negation is exact; outputs bitwise
  // those of neg + cat), in four kernels forward where neg and cat made five, and without the
  // narrows' zero-filled full-size gradients in the backward. Not addcmul: its fused multiply-add
  // rounds differently in vectorised and scalar loops, so decode and a full forward would drift
  // apart (a KV-cache test caught it).
  static at::Tensor applyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sinSigned) {
    std::vector<int64_t> halves = x.sizes().vec();
    halves.back() = 2;
    halves.push_back(x.size(-1) / 2);
    const at::Tensor swapped = x.reshape(halves).flip(-2).reshape(x.sizes());
    return x * cos + swapped * sinSigned;
  }
  std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                         const at::Tensor& sin) const override {
    return {applyRope(q, cos, sin), applyRope(k, cos, sin)};
  }

  at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) const override { return at::silu(gate) * up; }
  // split, not two narrows: its backward writes the two halves' gradients into one tensor (a cat),
  // where each narrow's backward would fill a full-width tensor with zeros and the two be added.
  at::Tensor swigluPacked(const at::Tensor& gateUp) const override {
    const std::vector<at::Tensor> gu = gateUp.split(gateUp.size(1) / 2, 1);
    return swiglu(gu[0], gu[1]);
  }
};

// ---- Checks the fused kernels make of their inputs (host side, before any launch) ----------------

std::string dt(at::ScalarType t) { return c10::toString(t); }

void requireActivation(const char* op, const at::Tensor& x) {
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16)
    throw std::runtime_error(std::string(op) + ": activations are " + dt(x.scalar_type()) +
                             "; the fused kernels take float32 and bfloat16");
}
void requireSame(const char* op, const char* what, const at::Tensor& a, const at::Tensor& ref) {
  if (a.scalar_type() != ref.scalar_type())
    throw std::runtime_error(std::string(op) + ": " + what + " is " + dt(a.scalar_type()) + ", expected " +
                             dt(ref.scalar_type()) + " (the activations' dtype)");
  if (a.device() != ref.device())
    throw std::runtime_error(std::string(op) + ": " + what + " is on " + a.device().str() + ", the activations on " +
                             ref.device().str());
}
void requireShape(const char* op, const char* what, bool ok, const at::Tensor& t, const std::string& expected) {
  if (!ok)
    throw std::runtime_error(std::string(op) + ": " + what + " has shape " + c10::str(t.sizes()) + ", expected " +
                             expected);
}
// The widths the kernels index with 32-bit integers.
void requireWidth(const char* op, int64_t width) {
  if (width < 1 || width > (int64_t(1) << 30))
    throw std::runtime_error(std::string(op) + ": last dimension " + std::to_string(width) + " outside [1, 2^30]");
}

void checkNorm(const char* op, const at::Tensor& x, const at::Tensor& w) {
  requireActivation(op, x);
  const int64_t width = x.dim() > 0 ? x.size(-1) : 0;
  requireWidth(op, width);
  const int64_t widest = cuda::normBackwardMaxWidth(width, int64_t(x.element_size()));
  if (width > widest)
    throw std::runtime_error(std::string(op) + ": rows of " + std::to_string(width) + " " + dt(x.scalar_type()) +
                             " elements are wider than the kernels take at that size (" + std::to_string(widest) +
                             ": their backward holds a row in registers)");
  requireShape(op, "the weight", w.dim() == 1 && w.size(0) == x.size(-1), w, "[" + std::to_string(x.size(-1)) + "]");
  if (w.scalar_type() != x.scalar_type() && !(w.scalar_type() == at::kFloat && x.scalar_type() == at::kBFloat16))
    throw std::runtime_error(std::string(op) + ": the weight is " + dt(w.scalar_type()) + " for activations in " +
                             dt(x.scalar_type()) +
                             " (expected the same dtype, or float32 master weights for bfloat16 activations)");
  if (w.device() != x.device())
    throw std::runtime_error(std::string(op) + ": the weight is on " + w.device().str() + ", the activations on " +
                             x.device().str());
}

bool cudaKernels() {
#ifdef PRIME_HAVE_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

// ---- Launch glue (CUDA builds with the kernels) --------------------------------------------------

const char* const kNoKernels =
    "fusedKernels: this addon was built without its CUDA kernels (no nvcc at build time; "
    "scripts/check-cuda-build.sh builds them)";

#ifdef PRIME_HAVE_CUDA_KERNELS
cuda::DType kdt(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 ? cuda::DType::BF16 : cuda::DType::F32; }
cudaStream_t streamOf(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
#endif

// Launches on CUDA tensors, or says why it cannot: a build without the kernels.
#ifdef PRIME_HAVE_CUDA_KERNELS
#define PRIME_LAUNCH(t, call)                 \
  do {                                        \
    c10::cuda::CUDAGuard guard((t).device()); \
    C10_CUDA_CHECK(call);                     \
  } while (0)
#else
#define PRIME_LAUNCH(t, call) throw std::runtime_error(kNoKernels)
#endif

// ---- RMSNorm (with the residual add) ----------------------------------------------------------

// Forward: s = delta ? x + delta : x (rounded to x's dtype), y = s rstd w; rstd [rows] fp32.
struct NormOut {
  at::Tensor s, y, rstd;
};
NormOut normForward(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& w, double eps) {
  const int64_t width = x.size(-1), rows = x.numel() / width;
  if (!x.is_cuda() && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat) {
    // fp32 on the CPU: the engine's loop (cpu_kernels.h NormArgs), one pass over each row.
    const at::Tensor xc = x.contiguous(), dc = delta.defined() ? delta.contiguous() : delta, wc = w.contiguous();
    at::Tensor s = delta.defined() ? at::empty_like(xc) : xc, y = at::empty_like(xc);
    at::Tensor rstd = at::empty({rows}, x.options());
    cpu::kernels().rmsNormF32({xc.data_ptr<float>(), dc.defined() ? dc.data_ptr<float>() : nullptr,
                               wc.data_ptr<float>(), delta.defined() ? s.data_ptr<float>() : nullptr,
                               y.data_ptr<float>(), rstd.data_ptr<float>(), rows, width, float(eps)});
    return {s, y, rstd};
  }
  if (!x.is_cuda()) {
    // The kernel's formulas as tensor ops (bf16 on a machine without a GPU, for tests).
    // Outputs are fresh tensors, never views (autograd refuses in-place changes of a view made
    // inside a custom function, and RoPE works in place on a norm's output).
    const at::Tensor s = delta.defined() ? (x.to(at::kFloat) + delta.to(at::kFloat)).to(x.scalar_type()) : x;
    const at::Tensor sf = s.to(at::kFloat);
    const at::Tensor rstd = at::rsqrt(sf.pow(2).mean(-1, /*keepdim=*/true) + eps);
    const at::Tensor wf = w.to(x.scalar_type()).to(at::kFloat);
    return {s, (sf * rstd * wf).to(x.scalar_type()), rstd.reshape({rows})};
  }
  const at::Tensor xc = x.contiguous(), dc = delta.defined() ? delta.contiguous() : delta, wc = w.contiguous();
  at::Tensor s = delta.defined() ? at::empty_like(xc) : xc, y = at::empty_like(xc);
  at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  PRIME_LAUNCH(x, cuda::rmsNormForward(kdt(xc), kdt(wc), xc.data_ptr(), dc.defined() ? dc.data_ptr() : nullptr,
                                       delta.defined() ? s.data_ptr() : nullptr, y.data_ptr(), rstd.data_ptr<float>(),
                                       wc.data_ptr(), rows, width, float(eps), streamOf(xc)));
  return {s, y, rstd};
}

// Backward: dx (of x and of delta) = rstd (w g - n mean(w g n)) + gSum; dw = sum over rows of g n.
std::pair<at::Tensor, at::Tensor> normBackward(const at::Tensor& g, const at::Tensor& gSum, const at::Tensor& s,
                                               const at::Tensor& rstd, const at::Tensor& w, bool wantX, bool wantW) {
  const int64_t width = s.size(-1), rows = s.numel() / width;
  if (!s.is_cuda() && s.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat) {
    const at::Tensor gc = g.contiguous(), gs = gSum.defined() ? gSum.contiguous() : gSum, sc = s.contiguous();
    const at::Tensor wc = w.contiguous(), rc = rstd.contiguous();
    at::Tensor dx = wantX ? at::empty_like(sc) : at::Tensor(), dw = wantW ? at::empty_like(wc) : at::Tensor();
    cpu::kernels().rmsNormBackwardF32({gc.data_ptr<float>(), gs.defined() ? gs.data_ptr<float>() : nullptr,
                                       sc.data_ptr<float>(), rc.data_ptr<float>(), wc.data_ptr<float>(),
                                       wantX ? dx.data_ptr<float>() : nullptr, wantW ? dw.data_ptr<float>() : nullptr,
                                       rows, width});
    return {dx, dw};
  }
  if (!s.is_cuda()) {
    const at::Tensor gf = g.to(at::kFloat).reshape({rows, width});
    const at::Tensor n = s.to(at::kFloat).reshape({rows, width}) * rstd.unsqueeze(1);
    at::Tensor dx, dw;
    if (wantX) {
      const at::Tensor wg = gf * w.to(s.scalar_type()).to(at::kFloat);
      at::Tensor d = rstd.unsqueeze(1) * (wg - n * (wg * n).mean(-1, /*keepdim=*/true));
      if (gSum.defined()) d = d + gSum.to(at::kFloat).reshape({rows, width});
      dx = d.to(s.scalar_type()).view(s.sizes());
    }
    if (wantW) dw = (gf * n).sum(0).to(w.scalar_type());
    return {dx, dw};
  }
  const at::Tensor gc = g.contiguous(), gs = gSum.defined() ? gSum.contiguous() : gSum, wc = w.contiguous();
  at::Tensor dx = wantX ? at::empty_like(s) : at::Tensor(), dw = wantW ? at::empty_like(wc) : at::Tensor(), work;
#ifdef PRIME_HAVE_CUDA_KERNELS
  if (wantW) work = at::empty({cuda::rmsNormBackwardWorkspace(rows, width)}, s.options().dtype(at::kFloat));
#endif
  // One pass over g and s for both gradients.
  PRIME_LAUNCH(s, cuda::rmsNormBackward(kdt(s), kdt(wc), gc.data_ptr(), gs.defined() ? gs.data_ptr() : nullptr,
                                        s.data_ptr(), rstd.data_ptr<float>(), wc.data_ptr(),
                                        wantX ? dx.data_ptr() : nullptr, wantW ? dw.data_ptr() : nullptr,
                                        wantW ? work.data_ptr<float>() : nullptr, rows, width, streamOf(s)));
  return {dx, dw};
}

struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, double eps) {
    NormOut o = normForward(x, at::Tensor(), w, eps);
    ctx->save_for_backward({o.s, o.rstd, w});
    return o.y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dx, dw] = normBackward(grads[0], at::Tensor(), saved[0], saved[1], saved[2], ctx->needs_input_grad(0),
                                 ctx->needs_input_grad(1));
    return {dx, dw, at::Tensor()};
  }
};

struct AddRmsNormFn : torch::autograd::Function<AddRmsNormFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& delta, const at::Tensor& w,
                               double eps) {
    NormOut o = normForward(x, delta, w, eps);
    ctx->save_for_backward({o.s, o.rstd, w});
    // An unused output's gradient arrives undefined (no zero-filled tensor to read).
    ctx->set_materialize_grads(false);
    return {o.s, o.y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &gSum = grads[0], &gY = grads[1];
    const bool wantX = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
    at::Tensor dx, dw;
    if (gY.defined()) {
      std::tie(dx, dw) = normBackward(gY, gSum, saved[0], saved[1], saved[2], wantX, ctx->needs_input_grad(2));
    } else {
      dx = gSum;  // the norm's output unused: the sum's gradient passes through the add
    }
    // The add's backward: the same gradient for both addends (as libtorch's add returns it).
    return {dx, dx, dw, at::Tensor()};
  }
};

// ---- RoPE --------------------------------------------------------------------------------------

// x [N, heads, hd] in the kernels' layout: heads and their elements contiguous (any token stride).
bool ropeLayout(const at::Tensor& x) { return x.stride(2) == 1 && x.stride(1) == x.size(2); }

void checkRope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
  const char* op = "fused RoPE";
  requireActivation(op, q);
  requireShape(op, "q", q.dim() == 3 && q.size(2) % 2 == 0, q, "[tokens, heads, an even head size]");
  const std::string qk = "[" + std::to_string(q.size(0)) + ", heads, " + std::to_string(q.size(2)) + "]";
  requireShape(op, "k", k.dim() == 3 && k.size(0) == q.size(0) && k.size(2) == q.size(2), k, qk);
  requireSame(op, "k", k, q);
  const std::string table = "[" + std::to_string(q.size(0)) + ", 1, " + std::to_string(q.size(2)) + "]";
  auto checkTable = [&](const char* name, const at::Tensor& t) {
    requireShape(op, name, t.numel() == q.size(0) * q.size(2) && t.size(-1) == q.size(2), t, table);
    requireSame(op, name, t, q);
  };
  checkTable("cos", cos);
  checkTable("sin", sin);
}

// out = rope(x) (or its transpose), out allocated unless given.
at::Tensor ropeApply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward,
                     at::Tensor out = at::Tensor()) {
  if (!x.is_cuda() && x.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat &&
      sin.scalar_type() == at::kFloat) {
    const at::Tensor xin = ropeLayout(x) ? x : x.contiguous();
    if (!out.defined()) out = at::empty(x.sizes(), x.options());
    const at::Tensor c = cos.contiguous(), s = sin.contiguous();
    cpu::kernels().ropeF32({xin.data_ptr<float>(), out.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(),
                            xin.stride(0), out.stride(0), x.size(0), x.size(1), x.size(2), backward});
    return out;
  }
  if (!x.is_cuda()) {
    const int64_t h = x.size(-1) / 2;
    const at::Tensor xf = x.to(at::kFloat), c = cos.to(at::kFloat).reshape({x.size(0), 1, 2 * h}),
                     s = sin.to(at::kFloat).reshape({x.size(0), 1, 2 * h});
    // The transpose swaps the sin table's halves.
    const at::Tensor sl = backward ? s.narrow(-1, h, h) : s.narrow(-1, 0, h),
                     sh = backward ? s.narrow(-1, 0, h) : s.narrow(-1, h, h);
    const at::Tensor a = xf.narrow(-1, 0, h), b = xf.narrow(-1, h, h);
    const at::Tensor r =
        at::cat({a * c.narrow(-1, 0, h) + b * sl, b * c.narrow(-1, h, h) + a * sh}, -1).to(x.scalar_type());
    return out.defined() ? out.copy_(r) : r;
  }
  const at::Tensor xin = ropeLayout(x) ? x : x.contiguous();
  if (!out.defined()) out = at::empty(x.sizes(), x.options());
  const at::Tensor c = cos.contiguous(), s = sin.contiguous();
  PRIME_LAUNCH(x, cuda::rope(kdt(x), backward, xin.data_ptr(), xin.stride(0), out.data_ptr(), out.stride(0),
                             c.data_ptr(), s.data_ptr(), x.size(0), x.size(1), x.size(2), streamOf(x)));
  return out;
}

// In place where autograd allows it and the layout is the kernels': not a view (autograd would
// have to rewrite the base's history), not a leaf that requires grad.
bool ropeInPlace(const at::Tensor& x) { return !x.is_view() && !(x.is_leaf() && x.requires_grad()) && ropeLayout(x); }

struct RopeFn : torch::autograd::Function<RopeFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                               const at::Tensor& sin) {
    variable_list out;
    for (const at::Tensor& x : {q, k}) {
      if (ropeInPlace(x)) {
        ropeApply(x, cos, sin, false, x);
        ctx->mark_dirty({x});
        out.push_back(x);
      } else {
        out.push_back(ropeApply(x, cos, sin, false));
      }
    }
    ctx->save_for_backward({cos, sin});
    ctx->set_materialize_grads(false);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    variable_list g(4);
    for (int i = 0; i < 2; i++)
      if (grads[i].defined() && ctx->needs_input_grad(i)) g[i] = ropeApply(grads[i], saved[0], saved[1], true);
    return g;
  }
};

// ---- SwiGLU ------------------------------------------------------------------------------------

void checkSwiglu(const at::Tensor& gate, const at::Tensor& up) {
  const char* op = "fused SwiGLU";
  requireActivation(op, gate);
  requireShape(op, "gate", gate.dim() == 2, gate, "[tokens, intermediate]");
  requireWidth(op, gate.size(1));
  requireShape(op, "up", up.sizes() == gate.sizes(), up, c10::str(gate.sizes()));
  requireSame(op, "up", up, gate);
}

// The kernels read rows with unit column stride; other layouts are copied first.
at::Tensor rowMajor(const at::Tensor& t) { return t.stride(1) == 1 ? t : t.contiguous(); }

at::Tensor swigluForward(const at::Tensor& gate, const at::Tensor& up) {
  if (!gate.is_cuda() && gate.scalar_type() == at::kFloat) {
    const at::Tensor g = rowMajor(gate), u = rowMajor(up);
    at::Tensor out = at::empty(gate.sizes(), gate.options());
    cpu::kernels().swigluF32({g.data_ptr<float>(), u.data_ptr<float>(), nullptr, out.data_ptr<float>(), nullptr,
                              nullptr, g.stride(0), u.stride(0), 0, g.size(0), g.size(1)});
    return out;
  }
  if (!gate.is_cuda()) {
    const at::Tensor g = gate.to(at::kFloat);
    return (g * at::sigmoid(g) * up.to(at::kFloat)).to(gate.scalar_type());
  }
  const at::Tensor g = rowMajor(gate), u = rowMajor(up);
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  PRIME_LAUNCH(g, cuda::swigluForward(kdt(g), g.data_ptr(), g.stride(0), u.data_ptr(), u.stride(0), out.data_ptr(),
                                      g.size(0), g.size(1), streamOf(g)));
  return out;
}

// The gradients of gate and up, in `into` ([rows, 2 width]: dGate its left half, dUp its right)
// when given, else as two tensors.
std::pair<at::Tensor, at::Tensor> swigluBackward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                                                 at::Tensor into = at::Tensor()) {
  const int64_t width = gate.size(1);
  at::Tensor dGate = into.defined() ? into.narrow(1, 0, width) : at::empty(gate.sizes(), gate.options());
  at::Tensor dUp = into.defined() ? into.narrow(1, width, width) : at::empty(gate.sizes(), gate.options());
  if (!gate.is_cuda() && gate.scalar_type() == at::kFloat && dGate.stride(0) == dUp.stride(0) && dGate.stride(1) == 1 &&
      dUp.stride(1) == 1) {
    const at::Tensor go = grad.contiguous(), g = rowMajor(gate), u = rowMajor(up);
    cpu::kernels().swigluBackwardF32({g.data_ptr<float>(), u.data_ptr<float>(), go.data_ptr<float>(), nullptr,
                                      dGate.data_ptr<float>(), dUp.data_ptr<float>(), g.stride(0), u.stride(0),
                                      dGate.stride(0), g.size(0), width});
    return {dGate, dUp};
  }
  if (!gate.is_cuda()) {
    const at::Tensor go = grad.to(at::kFloat), g = gate.to(at::kFloat), s = at::sigmoid(g);
    dGate.copy_(go * up.to(at::kFloat) * s * (1 + g * (1 - s)));
    dUp.copy_(go * g * s);
    return {dGate, dUp};
  }
  const at::Tensor go = grad.contiguous(), g = rowMajor(gate), u = rowMajor(up);
  PRIME_LAUNCH(g,
               cuda::swigluBackward(kdt(g), go.data_ptr(), g.data_ptr(), g.stride(0), u.data_ptr(), u.stride(0),
                                    dGate.data_ptr(), dUp.data_ptr(), dGate.stride(0), g.size(0), width, streamOf(g)));
  return {dGate, dUp};
}

struct SwigluFn : torch::autograd::Function<SwigluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return swigluForward(gate, up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dGate, dUp] = swigluBackward(grads[0], saved[0], saved[1]);
    return {dGate, dUp};
  }
};

// SwiGLU of a packed [rows, 2 width] gate/up projection: its gradient written as one tensor, the
// kernel filling both halves (no narrow views, whose backward would zero-fill full-width tensors).
struct SwigluPackedFn : torch::autograd::Function<SwigluPackedFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gateUp) {
    ctx->save_for_backward({gateUp});
    const int64_t width = gateUp.size(1) / 2;
    return swigluForward(gateUp.narrow(1, 0, width), gateUp.narrow(1, width, width));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor gateUp = ctx->get_saved_variables()[0];
    const int64_t width = gateUp.size(1) / 2;
    at::Tensor d = at::empty(gateUp.sizes(), gateUp.options());
    swigluBackward(grads[0], gateUp.narrow(1, 0, width), gateUp.narrow(1, width, width), d);
    return {d};
  }
};

// ---- The fused implementation --------------------------------------------------------------------

// Whether autograd must record the call (otherwise the forward runs alone, no graph node).
bool recording(std::initializer_list<const at::Tensor*> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

// The fused implementation of each op, its inputs checked: the autograd function, or the forward
// alone where autograd records nothing.
at::Tensor fusedRmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  if (!recording({&x, &w})) return normForward(x, at::Tensor(), w, eps).y;
  return RmsNormFn::apply(x, w, eps);
}
std::pair<at::Tensor, at::Tensor> fusedAddRmsNorm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& w,
                                                  double eps) {
  if (!recording({&x, &delta, &w})) {
    NormOut o = normForward(x, delta, w, eps);
    return {o.s, o.y};
  }
  const variable_list out = AddRmsNormFn::apply(x, delta, w, eps);
  return {out[0], out[1]};
}
std::pair<at::Tensor, at::Tensor> fusedRope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                            const at::Tensor& sin) {
  if (!recording({&q, &k})) {
    // No graph: in place whenever the layout allows (views included: nothing records them).
    auto one = [&](const at::Tensor& x) {
      return ropeLayout(x) ? ropeApply(x, cos, sin, false, x) : ropeApply(x, cos, sin, false);
    };
    return {one(q), one(k)};
  }
  const variable_list out = RopeFn::apply(q, k, cos, sin);
  return {out[0], out[1]};
}
at::Tensor fusedSwiglu(const at::Tensor& gate, const at::Tensor& up) {
  if (!recording({&gate, &up})) return swigluForward(gate, up);
  return SwigluFn::apply(gate, up);
}
at::Tensor fusedSwigluPacked(const at::Tensor& gateUp) {
  const int64_t width = gateUp.size(1) / 2;
  if (!recording({&gateUp})) return swigluForward(gateUp.narrow(1, 0, width), gateUp.narrow(1, width, width));
  return SwigluPackedFn::apply(gateUp);
}

class Fused final : public BlockKernels {
 public:
  at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) const override {
    checkNorm("fused RMSNorm", x, w);
    return fusedRmsNorm(x, w, eps);
  }
  std::pair<at::Tensor, at::Tensor> addRmsNorm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& w,
                                               double eps) const override {
    checkNorm("fused RMSNorm", x, w);
    requireShape("fused RMSNorm", "the residual's addend", delta.sizes() == x.sizes(), delta, c10::str(x.sizes()));
    requireSame("fused RMSNorm", "the residual's addend", delta, x);
    return fusedAddRmsNorm(x, delta, w, eps);
  }
  std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                         const at::Tensor& sin) const override {
    checkRope(q, k, cos, sin);
    return fusedRope(q, k, cos, sin);
  }
  at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) const override {
    checkSwiglu(gate, up);
    return fusedSwiglu(gate, up);
  }
  at::Tensor swigluPacked(const at::Tensor& gateUp) const override {
    requireShape("fused SwiGLU", "gate/up", gateUp.dim() == 2 && gateUp.size(1) % 2 == 0, gateUp,
                 "[tokens, 2 x intermediate]");
    const int64_t width = gateUp.size(1) / 2;
    checkSwiglu(gateUp.narrow(1, 0, width), gateUp.narrow(1, width, width));
    return fusedSwigluPacked(gateUp);
  }
};

// The default on the CPU: fp32 activations (and weights, tables) of a forward that autograd
// records (training), or of an inference forward of at least kLoopElements (a prefill chunk), go
// through the fused ops, whose CPU side is the engine's loops (cpu_kernels.h NormArgs, RopeArgs,
// SwigluArgs: one pass where libtorch 1.13's ops make several, each on one thread, on every host
// thread); anything else (a decode step, fp64, bf16, another device) through libtorch's ops, as
// Unfused: on a decode step's few rows the loops gained nothing clear (+28%, -1%, +2% in three
// pairs at batch 64; 3-10% slower when each call started its threads). PRIME_CPU_BLOCK_LOOPS=0
// turns the loops off, for a before/after in one build (bench/compare.ts).
constexpr int64_t kLoopElements = int64_t(1) << 18;

class CpuLoops final : public BlockKernels {
 public:
  at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) const override {
    return fp32Cpu({&x, &w}) ? fusedRmsNorm(x, w, eps) : unfused().rmsNorm(x, w, eps);
  }
  std::pair<at::Tensor, at::Tensor> addRmsNorm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& w,
                                               double eps) const override {
    return fp32Cpu({&x, &delta, &w}) && delta.sizes() == x.sizes() ? fusedAddRmsNorm(x, delta, w, eps)
                                                                   : unfused().addRmsNorm(x, delta, w, eps);
  }
  std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                         const at::Tensor& sin) const override {
    return fp32Cpu({&q, &k, &cos, &sin}) && q.dim() == 3 && q.size(2) % 2 == 0 ? fusedRope(q, k, cos, sin)
                                                                               : unfused().rope(q, k, cos, sin);
  }
  at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) const override {
    return fp32Cpu({&gate, &up}) && gate.dim() == 2 ? fusedSwiglu(gate, up) : unfused().swiglu(gate, up);
  }
  at::Tensor swigluPacked(const at::Tensor& gateUp) const override {
    return fp32Cpu({&gateUp}) && gateUp.dim() == 2 && gateUp.size(1) % 2 == 0 ? fusedSwigluPacked(gateUp)
                                                                              : unfused().swigluPacked(gateUp);
  }

 private:
  static const BlockKernels& unfused() { return unfusedBlockKernels(); }
  static bool fp32Cpu(std::initializer_list<const at::Tensor*> ts) {
    static const bool on = [] {
      const char* v = std::getenv("PRIME_CPU_BLOCK_LOOPS");
      if (!v || !*v || std::string(v) == "1") return true;
      if (std::string(v) == "0") return false;
      throw std::runtime_error(std::string("PRIME_CPU_BLOCK_LOOPS: '") + v + "' is not 0 or 1");
    }();
    if (!on || (!recording(ts) && (*ts.begin())->numel() < kLoopElements)) return false;
    for (const at::Tensor* t : ts)
      if (!t->device().is_cpu() || t->scalar_type() != at::kFloat) return false;
    return true;
  }
};

}  // namespace

const BlockKernels& unfusedBlockKernels() {
  static const Unfused k;
  return k;
}

const BlockKernels& fusedBlockKernels() {
  static const Fused k;
  return k;
}

const BlockKernels& cpuBlockKernels() {
  static const CpuLoops k;
  return k;
}

bool cudaKernelsBuilt() { return cudaKernels(); }

void checkFusedKernels(const at::Device& device, at::ScalarType dtype) {
  if (device.is_cuda() && !cudaKernels()) throw std::runtime_error(kNoKernels);
  if (dtype != at::kFloat && dtype != at::kBFloat16)
    throw std::runtime_error("fusedKernels: the fused kernels take float32 and bfloat16 models, not " + dt(dtype));
}

// ---- The LM head's rows ----------------------------------------------------------------------------

void fusedLmHeadForward(const at::Tensor& z, const at::Tensor& targets, double temperature, at::Tensor& logp,
                        at::Tensor& entropy, at::Tensor& logZ) {
  const char* op = "fused LM head";
  if (z.scalar_type() != at::kFloat || z.dim() != 2 || !z.is_contiguous() || !z.is_cuda())
    throw std::runtime_error(std::string(op) + ": logits must be a contiguous float32 CUDA matrix, not " +
                             dt(z.scalar_type()) + " " + c10::str(z.sizes()));
  const int64_t rows = z.size(0);
  if (targets.scalar_type() != at::kLong || targets.numel() != rows || !targets.is_contiguous())
    throw std::runtime_error(std::string(op) + ": targets must be " + std::to_string(rows) + " contiguous int64 ids");
  for (const at::Tensor* t : {&logp, &entropy, &logZ})
    if (t->numel() != rows || !t->is_contiguous() || t->scalar_type() != (t == &logZ ? at::kDouble : at::kFloat))
      throw std::runtime_error(std::string(op) + ": an output is not a contiguous [" + std::to_string(rows) +
                               "] tensor of its dtype");
  PRIME_LAUNCH(z, cuda::lmHeadForward(z.data_ptr<float>(), targets.data_ptr<int64_t>(), float(1.0 / temperature),
                                      logp.data_ptr<float>(), entropy.data_ptr<float>(), logZ.data_ptr<double>(), rows,
                                      z.size(1), streamOf(z)));
}

at::Tensor fusedLmHeadBackward(at::Tensor& z, const at::Tensor& targets, double temperature, const at::Tensor& logZ,
                               const at::Tensor& entropy, const at::Tensor& gLogp, const at::Tensor& gEnt,
                               at::ScalarType out) {
  if (out != at::kFloat && out != at::kBFloat16)
    throw std::runtime_error("fused LM head: the gradient's dtype is " + dt(out) + "; expected float32 or bfloat16");
  const at::Tensor gl = gLogp.to(at::kFloat).contiguous(),
                   ge = gEnt.defined() ? gEnt.to(at::kFloat).contiguous() : gEnt;
  const at::Tensor ent = entropy.to(at::kFloat).contiguous(), lz = logZ.contiguous();
  at::Tensor g = out == at::kFloat ? z : at::empty(z.sizes(), z.options().dtype(out));
  PRIME_LAUNCH(z, cuda::lmHeadBackward(z.data_ptr<float>(), targets.data_ptr<int64_t>(), float(1.0 / temperature),
                                       lz.data_ptr<double>(), ent.data_ptr<float>(), gl.data_ptr<float>(),
                                       ge.defined() ? ge.data_ptr<float>() : nullptr, kdt(g), g.data_ptr(), z.size(0),
                                       z.size(1), streamOf(z)));
  return g;
}

}  // namespace prime
