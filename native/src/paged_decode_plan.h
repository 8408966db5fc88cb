// How the CUDA paged decode kernel (cuda/paged_attention.cu) lays out one block, computed on the
// host without CUDA: plain C++ that nvcc, the CUDA build and the CPU build all compile, so that the
// bound is checked on the CPU for every model shape we ship (test/native.paged.test.ts) and the
// generator refuses a shape it cannot serve when it is created, not at its first decode step.
//
// A block serves one partition of positions of one (sequence, kv head) for the G = H / KV query
// heads that share it, and keeps in shared memory: the positions' K/V row offsets (int64), the
// scaled queries [G, hd] and the scores [G, partition] (fp32), and a max and a sum per head.
#pragma once

#include <cstdint>
#include <string>

namespace prime {

// Positions per partition when the block's shared memory allows it (a long context still splits
// into blocks of its own and fills the card at any batch).
constexpr int64_t kPagedPartition = 256;
// The smallest partition the kernel takes (a warp's worth of positions).
constexpr int64_t kPagedMinPartition = 32;
// Shared memory a block gets without opting in (every CUDA device since compute capability 2.0).
constexpr int64_t kDefaultSharedBytes = 48 * 1024;

// Bytes of shared memory of one block.
inline int64_t pagedDecodeSharedBytes(int64_t G, int64_t hd, int64_t partition) {
  return partition * int64_t(sizeof(int64_t)) + (G * hd + G * partition + 2 * G) * int64_t(sizeof(float));
}

struct PagedDecodePlan {
  int64_t partition = 0;    // positions per partition
  int64_t sharedBytes = 0;  // per block
  bool optIn = false;       // above kDefaultSharedBytes: the launcher opts the kernel in
  std::string why;          // non-empty: the shape cannot be served (and why)
};

// The plan for H query heads over KV kv heads of size hd, contexts of up to maxKeys positions, on a
// device whose blocks may opt in to `optInLimit` bytes of shared memory
// (cudaDevAttrMaxSharedMemoryPerBlockOptin; kDefaultSharedBytes where unknown): the default
// partition within the default shared memory; else the default partition opted in; else the
// largest smaller partition (a multiple of 32) that fits.
inline PagedDecodePlan pagedDecodePlan(int64_t H, int64_t KV, int64_t hd, int64_t maxKeys, int64_t optInLimit) {
  PagedDecodePlan p;
  if (KV < 1 || H < KV || H % KV != 0 || hd < 1) {
    p.why = "the kernel needs query heads a multiple of kv heads (" + std::to_string(H) + " over " +
            std::to_string(KV) + ") and a head size >= 1";
    return p;
  }
  // Positions are 32-bit inside; the combining kernel keeps a float per partition in shared memory.
  if (maxKeys < 1 || maxKeys > kDefaultSharedBytes / int64_t(sizeof(float)) * kPagedMinPartition) {
    p.why = "contexts of " + std::to_string(maxKeys) + " positions are outside what the kernel takes (1 to " +
            std::to_string(kDefaultSharedBytes / int64_t(sizeof(float)) * kPagedMinPartition) + ")";
    return p;
  }
  const int64_t G = H / KV, limit = optInLimit > kDefaultSharedBytes ? optInLimit : kDefaultSharedBytes;
  for (int64_t partition = kPagedPartition; partition >= kPagedMinPartition; partition -= 32) {
    const int64_t bytes = pagedDecodeSharedBytes(G, hd, partition);
    if (bytes <= limit && (maxKeys + partition - 1) / partition * int64_t(sizeof(float)) <= kDefaultSharedBytes) {
      p.partition = partition;
      p.sharedBytes = bytes;
      p.optIn = bytes > kDefaultSharedBytes;
      return p;
    }
  }
  p.why = std::to_string(G) + " query heads per kv head of size " + std::to_string(hd) + " need " +
          std::to_string(pagedDecodeSharedBytes(G, hd, kPagedMinPartition)) +
          " bytes of shared memory per block even with " + std::to_string(kPagedMinPartition) +
          "-position partitions; the device allows " + std::to_string(limit);
  return p;
}

// Floats of workspace for n sequences of H query heads, head size hd, maxKeys positions at most:
// each partition's max, sum and weighted values (hd + 2), read back by the kernel that combines a
// sequence's partitions. Unused (0) when one partition covers every sequence.
inline int64_t pagedDecodeWorkspace(int64_t n, int64_t H, int64_t hd, int64_t maxKeys, int64_t partition) {
  const int64_t parts = (maxKeys + partition - 1) / partition;
  return parts > 1 ? n * H * parts * (hd + 2) : 0;
}

}  // namespace prime
