// A caching allocator for large CPU tensors, installed as libtorch's CPU allocator.
//
// Why: glibc hands blocks over its mmap threshold (32 MiB at most) straight to the kernel and
// unmaps them on free. A training step at a 151,936-token vocabulary frees and re-allocates the
// same large buffers every step (the [chunk, vocab] logits, the embedding's gradient, activations),
// so every step faults them back in and the kernel zeroes each page again: about 15% of a step's
// CPU time in the profile of docs/benchmarks/compare.md, and decode pays it per step for its [batch, vocab] rows.
// Freed blocks of at least `kMinCachedBytes` are kept (by exact rounded size) for the next request
// of that size, as PyTorch's CUDA caching allocator does for device memory; at most the cache's
// capacity stays cached (the oldest freed blocks go first), so the cost is a bounded amount of
// resident memory. Capacity 0 turns caching off (and frees what is cached).
#pragma once

#include <cstddef>
#include <cstdint>

namespace prime {

struct CpuCacheStats {
  uint64_t hits = 0;            // large allocations served from the cache
  uint64_t misses = 0;          // large allocations that went to the system
  std::size_t cachedBytes = 0;  // freed large blocks held now
  std::size_t capacityBytes = 0;
};

// Installs the allocator (once; later calls only change the capacity) with this capacity.
void setCpuCacheCapacity(std::size_t bytes);
CpuCacheStats cpuCacheStats();

}  // namespace prime
