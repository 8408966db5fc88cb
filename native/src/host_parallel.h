// Parallel loops on the host for the kernels that walk memory themselves: the LM head's row
// kernels, AdamW, the sampler's rows, decode attention on the CPU. ATen runs one thread beside
// OpenBLAS's pthreads pool (SetThreads: a second, OpenMP pool spinning beside it slowed the
// matmuls), so these loops split their range over threads of their own, started for the call
// and joined before it returns: nothing waits or spins between calls, and OpenBLAS's idle
// threads yield their cores to them.
#pragma once

#include <cstdint>
#include <functional>

namespace prime {

// Threads a host loop may use: SetThreads sets it with OpenBLAS's count (before, every core); 1 = serial.
void setHostThreads(int n);
int hostThreads();

// fn(begin, end) over [0, n) in up to hostThreads() contiguous parts of at least `grain` items,
// the calling thread taking the first. Parts must not share writes. The first exception thrown
// by a part is rethrown here once every part has finished.
void hostParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// The grain of a loop over rows of `rowElems` elements: parts of at least 64K elements (rows of a
// small vocabulary are grouped), since starting a thread costs tens of microseconds, a pass over
// 64K floats about as much.
constexpr int64_t rowsGrain(int64_t rowElems) { return rowElems >= (1 << 16) ? 1 : (int64_t(1) << 16) / rowElems; }

}  // namespace prime
