#include "cpu_cache.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

namespace prime {
namespace {

// Blocks under this go to malloc and back at once (glibc's arenas already reuse them).
constexpr std::size_t kMinCachedBytes = std::size_t(1) << 20;
// Large sizes are rounded up to this, so that sizes a step repeats map to one free list.
constexpr std::size_t kRoundBytes = std::size_t(1) << 16;

class CachingCpuAllocator final : public c10::Allocator {
 public:
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  // libtorch 2.3 made allocate non-const and added copy_data.
  c10::DataPtr allocate(std::size_t n) override { return allocateBlock(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#else
  c10::DataPtr allocate(std::size_t n) const override { return allocateBlock(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void setCapacity(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    capacity_ = bytes;
    evictTo(capacity_);
  }

  CpuCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {hits_, misses_, cached_, capacity_};
  }

  static CachingCpuAllocator& instance() {
    static CachingCpuAllocator* allocator = new CachingCpuAllocator();  // static lifetime, as libtorch requires
    return *allocator;
  }

 private:
  struct Block {
    void* ptr;
    std::size_t size;
  };

  // Small blocks carry a deleter of their own, so freeing one takes no lock and no lookup;
  // `release` (the raw deleter, for raw_allocate's callers) handles both kinds.
  c10::DataPtr allocateBlock(std::size_t n) const {
    void* ptr = const_cast<CachingCpuAllocator*>(this)->take(n);
    return {ptr, ptr, n < kMinCachedBytes ? &freeSmall : &release, c10::Device(c10::DeviceType::CPU)};
  }

  static void freeSmall(void* ptr) { std::free(ptr); }

  static void* system(std::size_t size) {
    void* ptr = nullptr;
    // c10's own alignment (64 bytes), as its default allocator gives; size 0 still gets a pointer.
    if (posix_memalign(&ptr, c10::gAlignment, size == 0 ? 1 : size) != 0) return nullptr;
    return ptr;
  }

  void* take(std::size_t n) {
    if (n < kMinCachedBytes) {
      void* ptr = system(n);
      TORCH_CHECK(ptr != nullptr, "CPU allocator: out of memory allocating ", n, " bytes");
      return ptr;
    }
    const std::size_t size = (n + kRoundBytes - 1) / kRoundBytes * kRoundBytes;
    std::lock_guard<std::mutex> lock(mu_);
    auto hit = bySize_.find(size);
    if (hit != bySize_.end()) {
      Block b = *hit->second;
      lru_.erase(hit->second);
      bySize_.erase(hit);
      cached_ -= b.size;
      hits_++;
      live_.emplace(b.ptr, b.size);
      return b.ptr;
    }
    misses_++;
    void* ptr = system(size);
    if (ptr == nullptr) {  // what the cache holds goes back to the system, then one more try
      evictTo(0);
      ptr = system(size);
    }
    TORCH_CHECK(ptr != nullptr, "CPU allocator: out of memory allocating ", n, " bytes");
    live_.emplace(ptr, size);
    return ptr;
  }

  static void release(void* ptr) { instance().give(ptr); }

  void give(void* ptr) {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    if (it == live_.end()) {  // a small block, freed through the raw deleter
      std::free(ptr);
      return;
    }
    const std::size_t size = it->second;
    live_.erase(it);
    if (size > capacity_) {
      std::free(ptr);
      return;
    }
    evictTo(capacity_ - size);
    lru_.push_back({ptr, size});
    bySize_.emplace(size, std::prev(lru_.end()));
    cached_ += size;
  }

  // Frees the oldest cached blocks until at most `bytes` stay cached. Called with mu_ held.
  void evictTo(std::size_t bytes) {
    while (cached_ > bytes && !lru_.empty()) {
      Block b = lru_.front();
      auto range = bySize_.equal_range(b.size);
      for (auto it = range.first; it != range.second; ++it)
        if (it->second == lru_.begin()) {
          bySize_.erase(it);
          break;
        }
      lru_.pop_front();
      cached_ -= b.size;
      std::free(b.ptr);
    }
  }

  std::mutex mu_;
  std::list<Block> lru_;  // cached blocks, oldest first
  std::unordered_multimap<std::size_t, std::list<Block>::iterator> bySize_;
  std::unordered_map<void*, std::size_t> live_;  // large blocks in use, with their rounded size
  std::size_t cached_ = 0, capacity_ = 0;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace

void setCpuCacheCapacity(std::size_t bytes) {
  static std::once_flag installed;
  auto& allocator = CachingCpuAllocator::instance();
  allocator.setCapacity(bytes);
  // Priority above the default's: tensors allocated before keep their own deleter, so the switch
  // is safe at any time.
  std::call_once(installed, [&] { c10::SetCPUAllocator(&allocator, /*priority=*/1); });
}

CpuCacheStats cpuCacheStats() { return CachingCpuAllocator::instance().stats(); }

}  // namespace prime
