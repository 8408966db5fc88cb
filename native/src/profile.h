// A Kineto profile of one piece of work (libtorch 2.x): the CPU operators the calling thread runs
// and, on CUDA, every kernel and copy (CUPTI sees all threads). What `bench/compare.ts --profile`
// records of a training step, beside torch.profiler's record of PyTorch's: writes
//   <prefix>.txt   wall time, time the device was busy, and time by kernel (and by operator,
//                  inclusive: nested operators count in their parents too), largest first
//   <prefix>.json  the trace, for chrome://tracing or Perfetto
#pragma once

#include <functional>
#include <string>

#include <ATen/ATen.h>

namespace prime {

// Runs work under the profiler and writes the two files. Throws (before running the work) where
// this libtorch cannot profile (1.13, or a build without Kineto).
void profiled(const std::string& prefix, const at::Device& device, const std::function<void()>& work);

}  // namespace prime
