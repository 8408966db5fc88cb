#include "cuda_info.h"

#ifdef PRIME_HAVE_CUDA
// Only headers that need the CUDA runtime's own (ATen/cuda/CUDAContext.h would also want cuBLAS',
// cuSPARSE's and cuSOLVER's, which the prebuilt addon's build does not have).
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
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

#ifdef PRIME_HAVE_CUDA
// Events belong to the device current when they are made and record only on its streams: each call
// makes the timed device current for its span (a model on cuda:1 in a process that also uses cuda:0).
DeviceTimer::DeviceTimer(const at::Device& device) {
  if (!device.is_cuda()) return;
  device_ = indexOf(device);
  c10::cuda::CUDAGuard guard{c10::DeviceIndex(device_)};  // braces: guard(c10::DeviceIndex(x)) declares a function
  cudaEvent_t a = nullptr, b = nullptr;
  C10_CUDA_CHECK(cudaEventCreate(&a));
  C10_CUDA_CHECK(cudaEventCreate(&b));
  start_ = a;
  end_ = b;
  C10_CUDA_CHECK(cudaEventRecord(a, c10::cuda::getCurrentCUDAStream(c10::DeviceIndex(device_)).stream()));
}
DeviceTimer::~DeviceTimer() {
  if (start_) cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  if (end_) cudaEventDestroy(static_cast<cudaEvent_t>(end_));
}
void DeviceTimer::end() {
  if (!end_) return;
  c10::cuda::CUDAGuard guard{c10::DeviceIndex(device_)};  // braces: guard(c10::DeviceIndex(x)) declares a function
  C10_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(end_),
                                 c10::cuda::getCurrentCUDAStream(c10::DeviceIndex(device_)).stream()));
}
double DeviceTimer::seconds() {
  if (!end_) return 0;
  float ms = 0;
  C10_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end_)));
  C10_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(end_)));
  return ms / 1e3;
}
#else
DeviceTimer::DeviceTimer(const at::Device&) {}
DeviceTimer::~DeviceTimer() = default;
void DeviceTimer::end() {}
double DeviceTimer::seconds() { return 0; }
#endif

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
