#include "host_parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace prime {
namespace {
// Until SetThreads: every core, as ATen's own pool would have.
std::atomic<int> gHostThreads{int(std::max(1u, std::thread::hardware_concurrency()))};

// How long a helper keeps polling for its next part before it sleeps: a decode step's loops come
// back to back (tens a step, most under 0.2 ms apart), and waking a sleeping thread costs about
// 0.2 ms here (measured: 0.59 s of an 11 s decode run went to starting threads). It polls by
// yielding its core, so OpenBLAS's threads (a training step's GEMMs between these loops) take
// the core whenever they have work, as OpenBLAS's own idle threads yield to ours.
constexpr auto kPoll = std::chrono::microseconds(200);

inline void relax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// [0, n) in `parts` contiguous parts of `per` items (the last ones shorter, or empty).
struct Split {
  int64_t n, parts, per;
  int64_t begin(int64_t p) const { return std::min(n, p * per); }
  int64_t end(int64_t p) const { return std::min(n, (p + 1) * per); }
};

// The part of one call that a helper runs.
struct Part {
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t begin = 0, end = 0;
};

// One helper thread: it waits for its ticket to move, runs its part, reports to the pool. Its
// part is written only while it is idle (before the ticket moves), so it needs no lock.
class Helper {
 public:
  template <typename Done>
  explicit Helper(Done done) : thread_([this, done] { loop(done); }) {
    thread_.detach();  // lives as long as the process (the pool is never destroyed)
  }

  void start(const Part& part) {
    part_ = part;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ticket_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_one();
  }

 private:
  template <typename Done>
  void loop(Done done) {
    uint64_t seen = 0;
    for (;;) {
      const auto until = std::chrono::steady_clock::now() + kPoll;
      for (int i = 0; ticket_.load(std::memory_order_acquire) == seen; i++) {
        std::this_thread::yield();
        if ((i & 15) == 15 && std::chrono::steady_clock::now() > until) {
          std::unique_lock<std::mutex> lock(mutex_);
          wake_.wait(lock, [&] { return ticket_.load(std::memory_order_acquire) != seen; });
        }
      }
      seen = ticket_.load(std::memory_order_acquire);
      std::exception_ptr error;
      try {
        (*part_.fn)(part_.begin, part_.end);
      } catch (...) {
        error = std::current_exception();
      }
      done(error);
    }
  }

  std::atomic<uint64_t> ticket_{0};
  Part part_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
};

// Helper threads started once and kept: a call hands parts 1.. to helpers 0.., runs part 0 itself
// and polls until every helper has reported. One call at a time: a second caller (another thread
// of the process, or a part calling in again) starts threads of its own for its call.
class Pool {
 public:
  bool tryRun(const Split& split, const std::function<void(int64_t, int64_t)>& fn) {
    if (inPart_ || !busy_.try_lock()) return false;
    std::lock_guard<std::mutex> hold(busy_, std::adopt_lock);
    while (int64_t(helpers_.size()) < split.parts - 1)
      helpers_.push_back(std::make_unique<Helper>([this](std::exception_ptr e) { report(e); }));
    first_ = nullptr;
    std::vector<Part> parts;
    for (int64_t p = 1; p < split.parts; p++)
      if (split.begin(p) < split.end(p)) parts.push_back({&fn, split.begin(p), split.end(p)});
    pending_.store(int64_t(parts.size()), std::memory_order_relaxed);
    for (size_t h = 0; h < parts.size(); h++) helpers_[h]->start(parts[h]);
    try {
      inPart_ = true;
      fn(0, split.end(0));
      inPart_ = false;
    } catch (...) {
      inPart_ = false;
      report(std::current_exception(), false);
    }
    // The helpers' parts are as long as this one: poll, yielding the core after a while.
    for (int i = 0; pending_.load(std::memory_order_acquire) > 0; i++) {
      if (i < 4096) relax();
      else std::this_thread::yield();
    }
    if (first_) std::rethrow_exception(first_);
    return true;
  }

 private:
  void report(std::exception_ptr e, bool helper = true) {
    if (e) {
      std::lock_guard<std::mutex> lock(firstMutex_);
      if (!first_) first_ = e;
    }
    if (helper) pending_.fetch_sub(1, std::memory_order_acq_rel);
  }

  std::mutex busy_, firstMutex_;
  std::vector<std::unique_ptr<Helper>> helpers_;
  std::atomic<int64_t> pending_{0};
  std::exception_ptr first_;
  static thread_local bool inPart_;
};
thread_local bool Pool::inPart_ = false;

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: its detached helpers may outlive static destructors
  return *p;
}

// The fallback for a call the pool cannot take: threads started for the call and joined.
void runWithOwnThreads(const Split& split, const std::function<void(int64_t, int64_t)>& fn) {
  std::exception_ptr first;
  std::mutex firstMutex;
  auto run = [&](int64_t a, int64_t b) {
    try {
      fn(a, b);
    } catch (...) {
      std::lock_guard<std::mutex> lock(firstMutex);
      if (!first) first = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  helpers.reserve(size_t(split.parts - 1));
  for (int64_t p = 1; p < split.parts; p++)
    if (split.begin(p) < split.end(p)) helpers.emplace_back(run, split.begin(p), split.end(p));
  run(0, split.end(0));
  for (auto& t : helpers) t.join();
  if (first) std::rethrow_exception(first);
}
}  // namespace

void setHostThreads(int n) { gHostThreads = std::max(1, n); }
int hostThreads() { return gHostThreads.load(); }

void hostParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t parts = std::min<int64_t>(hostThreads(), std::max<int64_t>(1, n / std::max<int64_t>(grain, 1)));
  if (parts <= 1) return fn(0, n);
  const Split split{n, parts, (n + parts - 1) / parts};
  if (!pool().tryRun(split, fn)) runWithOwnThreads(split, fn);
}

}  // namespace prime
