// A profile of one piece of work: the CPU operators the calling thread runs and, on CUDA, every
// kernel and copy (libtorch 2.x's Kineto; CUPTI sees all threads); on libtorch 1.x (the CPU build)
// the legacy profiler's CPU operators. What `bench/compare.ts --profile` records of a training step,
// beside torch.profiler's record of PyTorch's: writes
//   <prefix>.txt   wall time, time the device was busy, and time by kernel (and by operator,
//                  inclusive: nested operators count in their parents too; on 1.x also each
//                  operator's self time, as torch.profiler's table), largest first
//   <prefix>.json  the trace, for chrome://tracing or Perfetto
#pragma once

#include <functional>
#include <string>

#include <ATen/ATen.h>

namespace prime {

// Runs work under the profiler and writes the two files. Throws (before running the work) where
// this libtorch cannot profile (a CUDA device under 1.x).
void profiled(const std::string& prefix, const at::Device& device, const std::function<void()>& work);

}  // namespace prime
