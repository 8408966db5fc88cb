// Parallel loops on the host for the kernels that walk memory themselves: the LM head's row
// kernels, AdamW, the sampler's rows, decode attention and the in-place linear on the CPU, the
// block ops. ATen runs one thread beside OpenBLAS's pthreads pool (SetThreads: a second, OpenMP
// pool spinning beside it slowed the matmuls), so these loops split their range over helper
// threads of their own, started once and kept (host_parallel.cc): between calls a helper polls
// for 0.2 ms, yielding its core (so OpenBLAS's threads take it whenever they have work, as its
// idle threads yield to ours), then sleeps. A thread started per call cost 0.2 ms before its part
// began: 0.59 s of an 11 s decode run at batch 64 went to starting threads.
#pragma once

#include <cstdint>
#include <functional>

namespace prime {

// Threads a host loop may use: SetThreads sets it with OpenBLAS's count (before, every core); 1 = serial.
void setHostThreads(int n);
int hostThreads();

// fn(begin, end) over [0, n) in up to hostThreads() contiguous parts of at least `grain` items,
// the calling thread taking the first. Parts must not share writes. The first exception thrown
// by a part is rethrown here once every part has finished. One call at a time runs on the kept
// helpers; a call made meanwhile (from another thread, or from inside a part) starts threads of
// its own.
void hostParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// The grain of a loop over rows of `rowElems` elements: parts of at least 64K elements (rows of a
// small vocabulary are grouped), since waking a helper that sleeps costs up to 0.2 ms, a pass over
// 64K floats tens of microseconds.
constexpr int64_t rowsGrain(int64_t rowElems) { return rowElems >= (1 << 16) ? 1 : (int64_t(1) << 16) / rowElems; }

}  // namespace prime
