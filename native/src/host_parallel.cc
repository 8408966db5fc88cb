#include "host_parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace prime {
namespace {
// Until SetThreads: every core, as ATen's own pool would have.
std::atomic<int> gHostThreads{int(std::max(1u, std::thread::hardware_concurrency()))};
}  // namespace

void setHostThreads(int n) { gHostThreads = std::max(1, n); }
int hostThreads() { return gHostThreads.load(); }

void hostParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t parts = std::min<int64_t>(hostThreads(), std::max<int64_t>(1, n / std::max<int64_t>(grain, 1)));
  if (parts <= 1) return fn(0, n);
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
  const int64_t per = (n + parts - 1) / parts;
  std::vector<std::thread> helpers;
  helpers.reserve(size_t(parts - 1));
  for (int64_t p = 1; p < parts; p++) {
    const int64_t a = p * per, b = std::min(n, a + per);
    if (a < b) helpers.emplace_back(run, a, b);
  }
  run(0, std::min(n, per));
  for (auto& t : helpers) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace prime
