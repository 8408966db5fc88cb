#include "paged_decode.h"

#include <atomic>
#include <cmath>
#include <stdexcept>

#ifdef PRIME_HAVE_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/paged_attention.h"
#endif

namespace prime {

PagedDecodePlan pagedDecodePlanOn(const at::Device& device, int64_t H, int64_t KV, int64_t hd, int64_t maxKeys) {
  int64_t limit = kDefaultSharedBytes;
#ifdef PRIME_HAVE_CUDA
  if (device.is_cuda()) {
    // Per device, read once (a driver call; a generator plans at each decode step's launch).
    static std::atomic<int64_t> optIn[64];
    const int index = device.has_index() ? device.index() : c10::cuda::current_device();
    const int64_t cached = index < 64 ? optIn[index].load() : 0;
    if (cached > 0) {
      limit = cached;
    } else {
      int v = 0;
      C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, index));
      limit = v > 0 ? v : kDefaultSharedBytes;
      if (index < 64) optIn[index].store(limit);
    }
  }
#else
  (void)device;
#endif
  return pagedDecodePlan(H, KV, hd, maxKeys, limit);
}

std::string pagedDecodeUnsupported(const at::Device& device, at::ScalarType dtype, int64_t H, int64_t KV, int64_t hd,
                                   int64_t maxKeys) {
#ifdef PRIME_HAVE_CUDA
  if (&cuda::pagedDecodeAttention == nullptr)
    return "this build of the addon has no CUDA kernels of its own (no nvcc: native/CMakeLists.txt)";
  if (!device.is_cuda()) return "the model is not on a CUDA device";
  if (dtype != at::kBFloat16 && dtype != at::kFloat) return "the kernel reads bf16 or fp32 caches";
  return pagedDecodePlanOn(device, H, KV, hd, maxKeys).why;
#else
  (void)device;
  (void)dtype;
  (void)H;
  (void)KV;
  (void)hd;
  (void)maxKeys;
  return "this build of the addon has no CUDA (native/cmake/torch.cmake)";
#endif
}

at::Tensor pagedDecodeAttention(const at::Tensor& q, const at::Tensor& kCache, const at::Tensor& vCache,
                                const at::Tensor& tables, const at::Tensor& pos, int64_t maxKeys) {
  const int64_t n = q.size(0), H = q.size(1), hd = q.size(2), B = kCache.size(1), KV = kCache.size(2);
#ifdef PRIME_HAVE_CUDA
  const std::string why = pagedDecodeUnsupported(q.device(), q.scalar_type(), H, KV, hd, maxKeys);
  if (!why.empty()) throw std::runtime_error("paged decode kernel: " + why);
  if (kCache.scalar_type() != q.scalar_type() || vCache.scalar_type() != q.scalar_type() || !kCache.is_contiguous() ||
      !vCache.is_contiguous() || kCache.size(3) != hd || q.stride(2) != 1 || q.stride(1) != hd ||
      kCache.device() != q.device() || vCache.device() != q.device() || tables.scalar_type() != at::kLong ||
      pos.scalar_type() != at::kLong || tables.size(0) != n || pos.size(0) != n)
    throw std::runtime_error("paged decode kernel: unexpected shapes, dtypes, strides or devices");
  // The caches' device current for the allocations, the stream and the launch, whatever device the
  // calling thread had current (a model on cuda:1 in a process that also uses cuda:0).
  c10::cuda::CUDAGuard guard(q.device());
  const PagedDecodePlan plan = pagedDecodePlanOn(q.device(), H, KV, hd, maxKeys);
  const at::Tensor t = tables.contiguous(), p = pos.contiguous();
  at::Tensor out = at::empty({n, H, hd}, q.options());
  const int64_t wsFloats = pagedDecodeWorkspace(n, H, hd, maxKeys, plan.partition);
  at::Tensor workspace = at::empty({wsFloats}, q.options().dtype(at::kFloat));
  const cudaError_t err = cuda::pagedDecodeAttention(
      q.scalar_type() == at::kBFloat16, q.data_ptr(), q.stride(0), kCache.data_ptr(), vCache.data_ptr(),
      t.data_ptr<int64_t>(), t.size(1), p.data_ptr<int64_t>(), out.data_ptr(),
      wsFloats > 0 ? workspace.data_ptr<float>() : nullptr, n, H, KV, hd, B, maxKeys, plan.partition,
      float(1.0 / std::sqrt(double(hd))), c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
  if (err != cudaSuccess) throw std::runtime_error(std::string("paged decode kernel: ") + cudaGetErrorString(err));
  return out;
#else
  (void)vCache;
  (void)tables;
  (void)pos;
  (void)n;
  (void)B;
  throw std::runtime_error("paged decode kernel: " +
                           pagedDecodeUnsupported(q.device(), q.scalar_type(), H, KV, hd, maxKeys));
#endif
}

}  // namespace prime
