#include "paged_decode.h"

#include <cmath>
#include <stdexcept>

#ifdef PRIME_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>

#include "cuda/paged_attention.h"
#endif

namespace prime {

std::string pagedDecodeUnsupported(const at::Device& device, at::ScalarType dtype) {
#ifdef PRIME_HAVE_CUDA
  if (&cuda::pagedDecodeAttention == nullptr)
    return "this build of the addon has no CUDA kernels of its own (no nvcc: native/CMakeLists.txt)";
  if (!device.is_cuda()) return "the model is not on a CUDA device";
  if (dtype != at::kBFloat16 && dtype != at::kFloat) return "the kernel reads bf16 or fp32 caches";
  return "";
#else
  (void)device;
  (void)dtype;
  return "this build of the addon has no CUDA (native/cmake/torch.cmake)";
#endif
}

at::Tensor pagedDecodeAttention(const at::Tensor& q, const at::Tensor& kCache, const at::Tensor& vCache,
                                const at::Tensor& tables, const at::Tensor& pos, int64_t maxKeys) {
#ifdef PRIME_HAVE_CUDA
  const std::string why = pagedDecodeUnsupported(q.device(), q.scalar_type());
  if (!why.empty()) throw std::runtime_error("paged decode kernel: " + why);
  const int64_t n = q.size(0), H = q.size(1), hd = q.size(2), B = kCache.size(1), KV = kCache.size(2);
  if (kCache.scalar_type() != q.scalar_type() || vCache.scalar_type() != q.scalar_type() || !kCache.is_contiguous() ||
      !vCache.is_contiguous() || kCache.size(3) != hd || q.stride(2) != 1 || q.stride(1) != hd ||
      tables.scalar_type() != at::kLong || pos.scalar_type() != at::kLong || tables.size(0) != n || pos.size(0) != n)
    throw std::runtime_error("paged decode kernel: unexpected shapes, dtypes or strides");
  const at::Tensor t = tables.contiguous(), p = pos.contiguous();
  at::Tensor out = at::empty({n, H, hd}, q.options());
  at::Tensor workspace = at::empty({cuda::pagedDecodeWorkspace(n, H, hd, maxKeys)}, q.options().dtype(at::kFloat));
  const cudaError_t err = cuda::pagedDecodeAttention(
      q.scalar_type() == at::kBFloat16, q.data_ptr(), q.stride(0), kCache.data_ptr(), vCache.data_ptr(),
      t.data_ptr<int64_t>(), t.size(1), p.data_ptr<int64_t>(), out.data_ptr(), workspace.data_ptr<float>(), n, H, KV,
      hd, B, maxKeys, float(1.0 / std::sqrt(double(hd))), c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
  if (err != cudaSuccess) throw std::runtime_error(std::string("paged decode kernel: ") + cudaGetErrorString(err));
  return out;
#else
  (void)kCache;
  (void)vCache;
  (void)tables;
  (void)pos;
  (void)maxKeys;
  throw std::runtime_error("paged decode kernel: " + pagedDecodeUnsupported(q.device(), q.scalar_type()));
#endif
}

}  // namespace prime
