#include "cpu_kernel_check.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "cpu_kernels.h"

namespace prime {
namespace {

double relError(const at::Tensor& got, const at::Tensor& exact) {
  const double scale = exact.abs().max().item<double>();
  return (got.to(at::kDouble) - exact).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

// x [M, K] W^T against fp64; W in `dt` (its rounded values are the exact inputs).
double checkLinear(const cpu::Kernels& k, at::ScalarType dt, int64_t M, int64_t K, int64_t N, at::Generator& gen) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor x = at::randn({M, K}, gen, f32), w = at::randn({N, K}, gen, f32).to(dt);
  at::Tensor y = at::full({M, N}, std::nan(""), f32);
  const cpu::LinearArgs args{x.data_ptr<float>(), w.data_ptr(), y.data_ptr<float>(), M, N, K, N};
  (dt == at::kBFloat16 ? k.linearBF16 : k.linearF32)(args);
  return relError(y, at::mm(x.to(at::kDouble), w.to(at::kDouble).t()));
}

// N tokens attending over a paged cache whose blocks are handed out in shuffled order: token t of
// sequence t % S at position pos[t] (the last tokens of a prefill chunk and decode rows alike).
double checkAttention(const cpu::Kernels& k, at::ScalarType dt, int64_t H, int64_t KV, int64_t hd, at::Generator& gen) {
  const int64_t B = 16, S = 3, blocksPerSeq = 5, N = 7;
  const int64_t blocks = S * blocksPerSeq;
  const auto f32 = at::TensorOptions().dtype(at::kFloat), i64 = at::TensorOptions().dtype(at::kLong);
  const at::Tensor kc = at::randn({blocks, B, KV, hd}, gen, f32).to(dt),
                   vc = at::randn({blocks, B, KV, hd}, gen, f32).to(dt);
  const at::Tensor tables = at::randperm(blocks, gen, i64).view({S, blocksPerSeq}).contiguous();
  const at::Tensor pos = at::tensor(std::vector<int64_t>{0, 1, 15, 16, 17, 40, 79}, i64);
  const at::Tensor seqOf = at::arange(N, i64).remainder(S);
  const at::Tensor q = at::randn({N, H, hd}, gen, f32).to(dt);
  at::Tensor out = at::full({N, H, hd}, std::nan(""), f32).to(dt);
  const cpu::PagedAttentionArgs args{q.data_ptr(),
                                     kc.data_ptr(),
                                     vc.data_ptr(),
                                     out.data_ptr(),
                                     pos.data_ptr<int64_t>(),
                                     seqOf.data_ptr<int64_t>(),
                                     tables.data_ptr<int64_t>(),
                                     blocksPerSeq,
                                     N,
                                     H,
                                     KV,
                                     hd,
                                     B};
  (dt == at::kBFloat16 ? k.pagedAttentionBF16 : k.pagedAttentionF32)(args);
  // Exact: each token's positions gathered through its table, softmax(q k / sqrt(hd)) v in fp64.
  at::Tensor exact = at::empty({N, H, hd}, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor kd = kc.to(at::kDouble).view({blocks * B, KV, hd}),
                   vd = vc.to(at::kDouble).view({blocks * B, KV, hd});
  for (int64_t t = 0; t < N; t++) {
    const int64_t len = pos[t].item<int64_t>() + 1;
    const at::Tensor p = at::arange(len, i64);
    const at::Tensor rows =
        tables[seqOf[t].item<int64_t>()].index_select(0, p.div(B, "floor")).mul(B).add(p.remainder(B));
    const at::Tensor keys = kd.index_select(0, rows).repeat_interleave(H / KV, 1);  // [len, H, hd]
    const at::Tensor vals = vd.index_select(0, rows).repeat_interleave(H / KV, 1);
    const at::Tensor qt = q[t].to(at::kDouble);  // [H, hd]
    const at::Tensor s = at::einsum("hd,lhd->hl", {qt, keys}) / std::sqrt(double(hd));
    exact[t] = at::einsum("hl,lhd->hd", {at::softmax(s, -1), vals});
  }
  return relError(out, exact);
}

// The LM head's row kernels on n rows of V fp32 logits at temperature 0.7 against fp64 on the same
// logits: the forward's log Z, target logprob and entropy, then the backward's rows (dL/d(z / T))
// from gradients of the logprob and, with entropyGrad, of the entropy. The largest of the errors.
double checkLmHeadRows(const cpu::Kernels& k, int64_t n, int64_t V, bool entropyGrad, at::Generator& gen) {
  const double T = 0.7;
  const auto f32 = at::TensorOptions().dtype(at::kFloat), f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor z = at::randn({n, V}, gen, f32) * 3;
  const at::Tensor t = at::randint(V, {n}, gen, at::TensorOptions().dtype(at::kLong));
  const at::Tensor gLogp = at::randn({n}, gen, f32), gEnt = entropyGrad ? at::randn({n}, gen, f32) : at::Tensor();
  const at::Tensor x = z.to(at::kDouble) / T, lp = at::log_softmax(x, 1), p = lp.exp();
  const at::Tensor logZ = x.logsumexp(1), logp = lp.gather(1, t.unsqueeze(1)).squeeze(1), ent = -(p * lp).sum(1);
  at::Tensor scale = gLogp.to(at::kDouble).unsqueeze(1);
  if (entropyGrad) scale = scale + gEnt.to(at::kDouble).unsqueeze(1) * (lp + ent.unsqueeze(1));
  const at::Tensor grad = (-p * scale).scatter_add(1, t.unsqueeze(1), gLogp.to(at::kDouble).unsqueeze(1));
  at::Tensor gotLogZ = at::full({n}, std::nan(""), f64), gotLogp = at::full({n}, std::nan(""), f32),
             gotEnt = at::full({n}, std::nan(""), f32);
  cpu::LmHeadRows<float> a{
      z.data_ptr<float>(),       t.data_ptr<int64_t>(),    n,       V,      float(1 / T), gotLogZ.data_ptr<double>(),
      gotLogp.data_ptr<float>(), gotEnt.data_ptr<float>(), nullptr, nullptr};
  k.lmHeadForwardF32(a);
  const double forward = std::max({relError(gotLogZ, logZ), relError(gotLogp, logp), relError(gotEnt, ent)});
  a.gLogp = gLogp.data_ptr<float>();
  a.gEnt = entropyGrad ? gEnt.data_ptr<float>() : nullptr;
  k.lmHeadBackwardF32(a);  // z becomes the gradient
  return std::max(forward, relError(z, grad));
}

// The sampler's row passes on n rows of V fp32 logits at temperature 0.7 against fp64: each
// block's sum of exp((x - max) / T) and every e (relative to the largest), the first maximum
// (a miss counts as error 1). Row 0 has its maximum twice (the first must win) and, past two
// blocks, a first block of -inf; a row with a NaN and a row of -inf must give -1.
double checkSampleRow(const cpu::Kernels& k, int64_t n, int64_t V, at::Generator& gen) {
  const double T = 0.7;
  const int64_t B = cpu::kSampleBlock, blocks = (V + B - 1) / B;
  at::Tensor z = at::randn({n, V}, gen, at::TensorOptions().dtype(at::kFloat)) * 3;
  const float top = z[0].max().item<float>() + 1;
  z[0][V - 1] = top;
  z[0][V / 2] = top;
  if (V > 2 * B) z[0].narrow(0, 0, B).fill_(-std::numeric_limits<float>::infinity());
  const at::Tensor x = z.to(at::kDouble), best = x.argmax(1);  // argmax: the first maximum
  const at::Tensor ex = ((x - x.amax(1, true)) / T).exp();
  const at::Tensor padded = at::constant_pad_nd(ex, {0, blocks * B - V}).view({n, blocks, B});
  const at::Tensor sums = padded.sum(2);
  at::Tensor e = at::full({n, V}, std::nan(""), at::TensorOptions().dtype(at::kFloat));
  at::Tensor gotSums = at::full({n, blocks}, std::nan(""), at::TensorOptions().dtype(at::kDouble));
  double error = 0;
  for (int64_t r = 0; r < n; r++) {
    const int64_t got = k.sampleRowF32(
        {z[r].data_ptr<float>(), e[r].data_ptr<float>(), gotSums[r].data_ptr<double>(), V, float(1 / T)});
    if (got != best[r].item<int64_t>()) error = 1;
  }
  error = std::max({error, relError(gotSums, sums), relError(e, ex)});
  for (float bad : {std::nanf(""), -std::numeric_limits<float>::infinity()}) {
    at::Tensor row = bad != bad ? z[0].clone().index_fill_(0, at::tensor({V / 3}), bad) : at::full({V}, bad);
    if (k.sampleRowF32({row.data_ptr<float>(), nullptr, gotSums[0].data_ptr<double>(), V, 1.f}) != -1) error = 1;
  }
  return error;
}

// The gated delta rule's recurrent step for R rows on their (shuffled) state slots against fp64:
// the rows' outputs and every slot after the step (those of no row unchanged). q and k l2-normed,
// g < 0 and beta in (0, 1), as the model makes them. The larger of the two errors.
double checkDeltaStep(const cpu::Kernels& k, int64_t R, int64_t H, int64_t dk, int64_t dv, at::Generator& gen) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat), i64 = at::TensorOptions().dtype(at::kLong);
  const int64_t numSlots = R + 3;
  auto unit = [](const at::Tensor& x) { return x / x.norm(2, -1, true); };
  const at::Tensor q = unit(at::randn({R, H, dk}, gen, f32)), kk = unit(at::randn({R, H, dk}, gen, f32));
  const at::Tensor v = at::randn({R, H, dv}, gen, f32);
  const at::Tensor g = -at::rand({R, H}, gen, f32), beta = at::rand({R, H}, gen, f32);
  const at::Tensor slots = at::randperm(numSlots, gen, i64).narrow(0, 0, R).contiguous();
  const at::Tensor before = at::randn({numSlots, H, dk, dv}, gen, f32);
  at::Tensor states = before.clone(), out = at::full({R, H, dv}, std::nan(""), f32);
  k.deltaStepF32({q.data_ptr<float>(), kk.data_ptr<float>(), v.data_ptr<float>(), g.data_ptr<float>(),
                  beta.data_ptr<float>(), slots.data_ptr<int64_t>(), states.data_ptr<float>(), out.data_ptr<float>(), R,
                  H, dk, dv});
  // Exact: S' = e S + k (beta (v - e S^T k))^T, out = S'^T q.
  const auto d = [](const at::Tensor& t) { return t.to(at::kDouble); };
  at::Tensor S = d(before).index_select(0, slots), e = d(g).exp().unsqueeze(-1).unsqueeze(-1);
  S = S * e;
  const at::Tensor read = at::matmul(d(kk).unsqueeze(-2), S).squeeze(-2);
  const at::Tensor delta = (d(v) - read) * d(beta).unsqueeze(-1);
  S = S + d(kk).unsqueeze(-1) * delta.unsqueeze(-2);
  const at::Tensor exactOut = at::matmul(d(q).unsqueeze(-2), S).squeeze(-2);
  const at::Tensor exactStates = d(before).index_copy(0, slots, S);
  return std::max(relError(out, exactOut), relError(states, exactStates));
}

// RMSNorm forward (with and without the residual add) and backward (with and without the
// residual's gradient) against fp64: the largest error of s, y, rstd, dx and dw.
double checkRmsNorm(const cpu::Kernels& k, int64_t rows, int64_t width, bool residual, at::Generator& gen) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor x = at::randn({rows, width}, gen, f32), delta = at::randn({rows, width}, gen, f32);
  const at::Tensor w = at::rand({width}, gen, f32) + 0.5, g = at::randn({rows, width}, gen, f32);
  const at::Tensor gSum = at::randn({rows, width}, gen, f32);
  at::Tensor s = at::empty_like(x), y = at::empty_like(x), rstd = at::empty({rows}, f32);
  const float eps = 1e-6f;
  k.rmsNormF32({x.data_ptr<float>(), residual ? delta.data_ptr<float>() : nullptr, w.data_ptr<float>(),
                residual ? s.data_ptr<float>() : nullptr, y.data_ptr<float>(), rstd.data_ptr<float>(), rows, width,
                eps});
  const at::Tensor sUsed = residual ? s : x;
  at::Tensor dx = at::empty_like(x), dw = at::empty_like(w);
  k.rmsNormBackwardF32({g.data_ptr<float>(), residual ? gSum.data_ptr<float>() : nullptr, sUsed.data_ptr<float>(),
                        rstd.data_ptr<float>(), w.data_ptr<float>(), dx.data_ptr<float>(), dw.data_ptr<float>(), rows,
                        width});
  // Exact, from the same fp32 inputs (the backward from the kernel's own s, as autograd saves it).
  const auto d = [](const at::Tensor& t) { return t.to(at::kDouble); };
  const at::Tensor sx = residual ? d(x) + d(delta) : d(x);
  const at::Tensor r = at::rsqrt(sx.pow(2).mean(-1, true) + double(eps));
  const at::Tensor n = d(sUsed) * d(rstd).unsqueeze(1), wg = d(g) * d(w);
  at::Tensor exactDx = d(rstd).unsqueeze(1) * (wg - n * (wg * n).mean(-1, true));
  if (residual) exactDx = exactDx + d(gSum);
  double e = std::max({relError(y, sx * r * d(w)), relError(rstd, r.squeeze(1)), relError(dx, exactDx),
                       relError(dw, (d(g) * n).sum(0))});
  if (residual) e = std::max(e, relError(s, sx));
  return e;
}

// RoPE of x [N, H, hd] (tokens `pad` floats further apart than a row, as a view of a wider tensor)
// and its transpose, out of place and in place, against fp64.
double checkRope(const cpu::Kernels& k, int64_t N, int64_t H, int64_t hd, at::Generator& gen) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const int64_t pad = 3, h = hd / 2;
  const at::Tensor wide = at::randn({N, H * hd + pad}, gen, f32);
  const at::Tensor x = wide.narrow(1, 0, H * hd).view({N, H, hd});
  const at::Tensor f = at::rand({N, h}, gen, f32) * 6.0;
  const at::Tensor cos = at::cat({f.cos(), f.cos()}, 1).contiguous(),
                   sin = at::cat({-f.sin(), f.sin()}, 1).contiguous();
  double e = 0;
  for (bool transpose : {false, true}) {
    at::Tensor out = at::empty({N, H, hd}, f32);
    k.ropeF32({x.data_ptr<float>(), out.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(), x.stride(0),
               out.stride(0), N, H, hd, transpose});
    const at::Tensor xd = x.to(at::kDouble), c = cos.to(at::kDouble).unsqueeze(1), s = sin.to(at::kDouble).unsqueeze(1);
    const at::Tensor lo = xd.narrow(2, 0, h), hi = xd.narrow(2, h, h);
    const at::Tensor sLo = transpose ? s.narrow(2, h, h) : s.narrow(2, 0, h);
    const at::Tensor sHi = transpose ? s.narrow(2, 0, h) : s.narrow(2, h, h);
    const at::Tensor exact = at::cat({lo * c.narrow(2, 0, h) + hi * sLo, hi * c.narrow(2, h, h) + lo * sHi}, 2);
    e = std::max(e, relError(out, exact));
    at::Tensor inPlace = x.clone();  // contiguous: in place, out == x
    k.ropeF32({inPlace.data_ptr<float>(), inPlace.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
               inPlace.stride(0), inPlace.stride(0), N, H, hd, transpose});
    e = std::max(e, relError(inPlace, exact));
  }
  return e;
}

// SwiGLU forward and backward on the halves of a packed [N, 2 I] projection (rows 2 I apart, the
// gradients into one packed tensor), against fp64.
double checkSwiglu(const cpu::Kernels& k, int64_t N, int64_t I, at::Generator& gen) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor gu = at::randn({N, 2 * I}, gen, f32) * 3.0, grad = at::randn({N, I}, gen, f32);
  const at::Tensor gate = gu.narrow(1, 0, I), up = gu.narrow(1, I, I);
  at::Tensor out = at::empty({N, I}, f32), dgu = at::empty({N, 2 * I}, f32);
  k.swigluF32({gate.data_ptr<float>(), up.data_ptr<float>(), nullptr, out.data_ptr<float>(), nullptr, nullptr,
               gu.stride(0), gu.stride(0), 0, N, I});
  k.swigluBackwardF32({gate.data_ptr<float>(), up.data_ptr<float>(), grad.data_ptr<float>(), nullptr,
                       dgu.data_ptr<float>(), dgu.data_ptr<float>() + I, gu.stride(0), gu.stride(0), dgu.stride(0), N,
                       I});
  const at::Tensor g = gate.to(at::kDouble), u = up.to(at::kDouble), go = grad.to(at::kDouble), sg = at::sigmoid(g);
  return std::max({relError(out, g * sg * u), relError(dgu.narrow(1, 0, I), go * u * sg * (1 + g * (1 - sg))),
                   relError(dgu.narrow(1, I, I), go * g * sg)});
}

}  // namespace

std::vector<CpuKernelCheck> cpuKernelCheck(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  std::vector<CpuKernelCheck> out;
  for (const char* isa : {"default", "avx2", "avx512"}) {
    const cpu::Kernels* k = cpu::kernelsFor(isa);
    if (!k) continue;
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
      const std::string dtype = dt == at::kFloat ? "float32" : "bfloat16";
      // Full tiles, row and column tails, a K that is no multiple of a vector, one row.
      for (auto [M, K, N] :
           {std::tuple<int64_t, int64_t, int64_t>{64, 512, 300}, {5, 200, 131}, {1, 37, 13}, {9, 64, 7}})
        out.push_back({isa, "linear", dtype, std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N),
                       checkLinear(*k, dt, M, K, N, gen)});
      // Vectorised head sizes and a scalar one; query groups of 2 and 3 (an odd group).
      for (auto [H, KV, hd] : {std::tuple<int64_t, int64_t, int64_t>{8, 4, 64}, {6, 2, 128}, {4, 2, 16}, {3, 1, 64}})
        out.push_back({isa, "pagedAttention", dtype,
                       "H " + std::to_string(H) + ", KV " + std::to_string(KV) + ", hd " + std::to_string(hd),
                       checkAttention(*k, dt, H, KV, hd, gen)});
    }
    // fp32 only: a Qwen3-sized vocabulary, and one with a tail past every vector width.
    for (auto [n, V] : {std::pair<int64_t, int64_t>{3, 151936}, {5, 1001}})
      for (bool entropyGrad : {false, true})
        out.push_back({isa, "lmHeadRows", "float32",
                       std::to_string(n) + "x" + std::to_string(V) + (entropyGrad ? ", entropy gradient" : ""),
                       checkLmHeadRows(*k, n, V, entropyGrad, gen)});
    for (auto [n, V] : {std::pair<int64_t, int64_t>{3, 151936}, {4, 1001}, {2, 7}})
      out.push_back(
          {isa, "sampleRow", "float32", std::to_string(n) + "x" + std::to_string(V), checkSampleRow(*k, n, V, gen)});
    // Qwen3.5's heads (128 x 128: whole vectors), column tails of every width, a scalar-only one.
    for (auto [R, H, dk, dv] :
         {std::tuple<int64_t, int64_t, int64_t, int64_t>{3, 4, 128, 128}, {5, 3, 16, 40}, {2, 2, 5, 7}})
      out.push_back({isa, "deltaStep", "float32",
                     std::to_string(R) + " rows, H " + std::to_string(H) + ", dk " + std::to_string(dk) + ", dv " +
                         std::to_string(dv),
                     checkDeltaStep(*k, R, H, dk, dv, gen)});
    // The block ops, fp32: whole vectors and tails of every width; rows for one part and for several.
    for (auto [rows, width] : {std::pair<int64_t, int64_t>{5, 512}, {300, 37}})
      for (bool residual : {false, true})
        out.push_back({isa, "rmsNorm", "float32",
                       std::to_string(rows) + "x" + std::to_string(width) + (residual ? ", residual add" : ""),
                       checkRmsNorm(*k, rows, width, residual, gen)});
    for (auto [N, H, hd] : {std::tuple<int64_t, int64_t, int64_t>{7, 4, 64}, {3, 2, 10}})
      out.push_back({isa, "rope", "float32",
                     std::to_string(N) + " tokens, H " + std::to_string(H) + ", hd " + std::to_string(hd),
                     checkRope(*k, N, H, hd, gen)});
    for (auto [N, I] : {std::pair<int64_t, int64_t>{4, 1280}, {70, 1001}})
      out.push_back(
          {isa, "swiglu", "float32", std::to_string(N) + "x" + std::to_string(I), checkSwiglu(*k, N, I, gen)});
  }
  return out;
}

}  // namespace prime
