#include "cpu_matmul.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "autocast.h"
#include "cpu_kernels.h"
#include "host_parallel.h"

namespace prime {

bool cpuHasBf16Dot() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
  return has;
#else
  return false;
#endif
}

namespace {
// Rows of x up to which the weights are read in place (cpu_kernels.h LinearArgs) rather than
// packed by the BLAS: a decode step's batch. PRIME_CPU_INPLACE_ROWS sets another bound (0: never),
// for measuring one against the other in one build (bench/compare.ts).
int64_t inPlaceRows() {
  static const int64_t rows = [] {
    const char* v = std::getenv("PRIME_CPU_INPLACE_ROWS");
    if (!v || !*v) return int64_t(64);
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    if (*end || n < 0)
      throw std::runtime_error(std::string("PRIME_CPU_INPLACE_ROWS: '") + v + "' is not a row count >= 0");
    return int64_t(n);
  }();
  return rows;
}
// Weight rows converted to fp32 per block (viaFp32): about 4 MiB, so a block and the BLAS's
// packing of it stay in cache while the GEMM reads them.
constexpr int64_t kBlockBytes = int64_t(4) << 20;

std::vector<int64_t> outShape(const at::Tensor& x, int64_t n) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n;
  return shape;
}

// x [.., K] W^T through the in-place kernel: fp32 sums, the result in fp32.
at::Tensor inPlace(const at::Tensor& x2, const at::Tensor& w) {
  const at::Tensor wc = w.contiguous();
  const int64_t M = x2.size(0), N = w.size(0), K = w.size(1);
  at::Tensor y = at::empty({M, N}, x2.options());
  const cpu::LinearArgs args{x2.data_ptr<float>(), wc.data_ptr(), y.data_ptr<float>(), M, N, K, N};
  if (w.scalar_type() == at::kBFloat16) cpu::kernels().linearBF16(args);
  else cpu::kernels().linearF32(args);
  return y;
}

// bf16 x [.., K] W^T as fp32 GEMMs: W converted a block of rows at a time.
at::Tensor viaFp32(const at::Tensor& x2, const at::Tensor& w) {
  const int64_t K = w.size(1), N = w.size(0), M = x2.size(0);
  at::Tensor y = at::empty({M, N}, x2.options());
  const at::Tensor wc = w.contiguous();
  const int64_t rows = std::max<int64_t>(64, kBlockBytes / (K * int64_t(sizeof(float))));
  at::Tensor block = at::empty({std::min(rows, N), K}, x2.options());
  const at::BFloat16* src = wc.data_ptr<at::BFloat16>();
  for (int64_t n0 = 0; n0 < N; n0 += rows) {
    const int64_t n = std::min(rows, N - n0);
    float* dst = block.data_ptr<float>();
    const at::BFloat16* s = src + n0 * K;
    // The conversion on the host threads (the GEMM below runs on the BLAS's own).
    hostParallelFor(n * K, int64_t(1) << 16, [&](int64_t a, int64_t e) {
#pragma omp simd
      for (int64_t i = a; i < e; i++) dst[i] = float(s[i]);
    });
    at::Tensor yb = y.narrow(1, n0, n);  // a column block: the BLAS writes it with row stride N
    at::mm_out(yb, x2, block.narrow(0, 0, n).t());
  }
  return y;
}
}  // namespace

at::Tensor linearOn(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, std::optional<at::ScalarType> out) {
  const at::ScalarType xt = x.scalar_type();
  const bool mine = x.is_cpu() && w.is_cpu() && w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1) &&
                    xt == w.scalar_type() && (xt == at::kFloat || xt == at::kBFloat16) && !at::GradMode::is_enabled() &&
                    !AutocastGuard::active(at::Device(at::kCPU));
  const int64_t M = mine ? x.numel() / x.size(-1) : 0;
  // bf16 where the CPU multiplies it (oneDNN's kernels), larger fp32 products (the BLAS), and
  // whatever records a gradient or runs under autocast: libtorch's linear.
  if (!mine || (xt == at::kBFloat16 && cpuHasBf16Dot()) ||
      (xt == at::kFloat && (M > inPlaceRows() || std::string(cpu::kernels().isa) == "default"))) {
    at::Tensor y = at::linear(x, w, b);
    return !out || y.scalar_type() == *out ? y : y.to(*out);
  }
  const at::Tensor x2 = x.reshape({M, x.size(-1)}).to(at::kFloat).contiguous();
  // The in-place kernel is vectorised for AVX2 and AVX-512 (its baseline copy is not).
  const bool inPlaceFits = M <= inPlaceRows() && std::string(cpu::kernels().isa) != "default";
  at::Tensor y = inPlaceFits ? inPlace(x2, w) : viaFp32(x2, w);
  if (b.defined()) y.add_(b.to(at::kFloat));
  return y.view(outShape(x, w.size(0))).to(out.value_or(xt));
}

}  // namespace prime
