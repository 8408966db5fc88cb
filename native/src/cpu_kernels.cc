#include "cpu_kernels.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace prime::cpu {

// One table per copy of cpu/kernels.cc (native/cmake/cpu_kernels.cmake).
namespace DEFAULT {
extern const Kernels kKernels;
}
#ifdef PRIME_CPU_KERNELS_X86
namespace AVX2 {
extern const Kernels kKernels;
}
namespace AVX512 {
extern const Kernels kKernels;
}
#endif

const Kernels& kernels() {
  // The widest copy this CPU runs, as ATen chooses its own kernels; ATEN_CPU_CAPABILITY (default,
  // avx2, avx512) lowers the choice for both.
  static const Kernels* chosen = [] {
    const char* env = std::getenv("ATEN_CPU_CAPABILITY");
    const std::string cap = env && *env ? env : "avx512";
    if (cap != "default" && cap != "avx2" && cap != "avx512")
      throw std::runtime_error("ATEN_CPU_CAPABILITY: '" + cap + "' is not default, avx2 or avx512");
    for (const char* isa : {"avx512", "avx2"}) {
      if (cap == "avx2" && std::string(isa) == "avx512") continue;
      if (cap == "default") break;
      if (const Kernels* k = kernelsFor(isa)) return k;
    }
    return &DEFAULT::kKernels;
  }();
  return *chosen;
}

const Kernels* kernelsFor(const std::string& isa) {
  if (isa == "default") return &DEFAULT::kKernels;
#ifdef PRIME_CPU_KERNELS_X86
  // The instruction sets cmake/cpu_kernels.cmake compiles each copy with.
  if (isa == "avx2" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2"))
    return &AVX2::kKernels;
  if (isa == "avx512" && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("bmi2"))
    return &AVX512::kKernels;
#endif
  return nullptr;
}

}  // namespace prime::cpu
