// Facts about, and objects of, a CUDA device that need CUDA's headers, which CPU builds lack (PRIME_HAVE_CUDA:
// native/CMakeLists.txt).
#pragma once

#include <ATen/ATen.h>

namespace prime {

// The device's compute capability major version (9 for Hopper), or -1 off CUDA or in a build
// without CUDA.
int cudaCapabilityMajor(const at::Device& device);

// The device's memory in bytes: its total, and what is in use on it (by any process), after the
// device finished its queued work. Zeros off CUDA or in a build without CUDA.
struct CudaMemory {
  int64_t total = 0, used = 0;
};
CudaMemory cudaMemory(const at::Device& device);

// Device time between two points of the current stream of a CUDA device (events), whichever device
// the calling thread has current; zero elsewhere.
class DeviceTimer {
 public:
  explicit DeviceTimer(const at::Device& device);  // the start, recorded now
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;
  void end();        // the end, recorded now (after the last launch to be timed)
  double seconds();  // between the two, once the device has passed the end (waits for it)

 private:
  void* start_ = nullptr;
  void* end_ = nullptr;
  int device_ = -1;  // the CUDA device timed
};

// A new generator on the CUDA device, seeded; undefined in a build without CUDA.
at::Generator seededCudaGenerator(const at::Device& device, uint64_t seed);

}  // namespace prime
