#include "cuda_info.h"

#ifdef PRIME_HAVE_CUDA
// Only headers that need the CUDA runtime's own (ATen/cuda/CUDAContext.h would also want cuBLAS',
// cuSPARSE's and cuSOLVER's, which the prebuilt addon's build does not have).
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace prime {

#ifdef PRIME_HAVE_CUDA
namespace {
c10::DeviceIndex indexOf(const at::Device& device) {
  return device.has_index() ? device.index() : c10::cuda::current_device();
}
}  // namespace
#endif

int cudaCapabilityMajor(const at::Device& device) {
#ifdef PRIME_HAVE_CUDA
  if (!device.is_cuda()) return -1;
  int major = -1;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, indexOf(device)));
  return major;
#else
  (void)device;
  return -1;
#endif
}

CudaMemory cudaMemory(const at::Device& device) {
  CudaMemory m;
#ifdef PRIME_HAVE_CUDA
  if (!device.is_cuda()) return m;
  c10::cuda::CUDAGuard guard(indexOf(device));
  C10_CUDA_CHECK(cudaDeviceSynchronize());  // deliberate: once, when a generator sizes its cache
  size_t free = 0, total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  m.total = int64_t(total);
  m.used = int64_t(total - free);
#else
  (void)device;
#endif
  return m;
}

at::Generator seededCudaGenerator(const at::Device& device, uint64_t seed) {
#ifdef PRIME_HAVE_CUDA
  at::Generator g = at::cuda::detail::createCUDAGenerator(indexOf(device));
  g.set_current_seed(seed);
  return g;
#else
  (void)device;
  (void)seed;
  return {};
#endif
}

}  // namespace prime
