#include "cpu_kernel_check.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <tuple>

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
  }
  return out;
}

}  // namespace prime
