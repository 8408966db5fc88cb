#include "profile.h"

#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>
#include <vector>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

namespace prime {

#if TORCH_VERSION_MAJOR >= 2

namespace {
struct Total {
  uint64_t ns = 0;
  int64_t calls = 0;
};

// "name: total ms (calls)" rows, largest first, at most `limit`.
void table(std::ostream& out, const std::string& title, const std::map<std::string, Total>& byName, size_t limit) {
  std::vector<std::pair<std::string, Total>> rows(byName.begin(), byName.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  out << "\n" << title << " (" << rows.size() << " names)\n| ms | calls | name |\n| ---: | ---: | --- |\n";
  for (size_t i = 0; i < rows.size() && i < limit; i++) {
    char ms[32];
    snprintf(ms, sizeof ms, "%.3f", double(rows[i].second.ns) / 1e6);
    std::string name = rows[i].first.substr(0, 160);
    std::replace(name.begin(), name.end(), '|', '/');
    out << "| " << ms << " | " << rows[i].second.calls << " | " << name << " |\n";
  }
}
}  // namespace

void profiled(const std::string& prefix, const at::Device& device, const std::function<void()>& work) {
  namespace prof = torch::profiler::impl;
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (device.is_cuda()) activities.insert(prof::ActivityType::CUDA);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    work();
    if (device.is_cuda())
      at::empty({1}, at::TensorOptions().device(device))
          .cpu();  // deliberate sync: the step's kernels end inside the profile
  } catch (...) {
    torch::autograd::profiler::disableProfiler();
    throw;
  }
  const double wallMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result = torch::autograd::profiler::disableProfiler();
  std::map<std::string, Total> kernels, ops;
  for (const auto& e : result->events()) {
    Total& t = (e.deviceType() == c10::DeviceType::CUDA ? kernels : ops)[e.name()];
    t.ns += e.durationNs();
    t.calls++;
  }
  uint64_t deviceNs = 0;
  for (const auto& [name, t] : kernels) deviceNs += t.ns;
  const std::string txt = prefix + ".txt", tmp = txt + ".tmp";
  {
    std::ofstream out(tmp);
    char head[200];
    snprintf(head, sizeof head, "wall %.3f ms; device busy (kernels and copies, summed) %.3f ms\n", wallMs,
             double(deviceNs) / 1e6);
    out << head;
    if (device.is_cuda()) table(out, "CUDA kernels and copies", kernels, 40);
    table(out, "CPU operators (inclusive)", ops, 40);
    if (!out) throw std::runtime_error("profile: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), txt.c_str()) != 0) throw std::runtime_error("profile: cannot write " + txt);
  result->save(prefix + ".json");
}

#else

void profiled(const std::string&, const at::Device&, const std::function<void()>&) {
  throw std::runtime_error("profile: needs the addon built against libtorch 2.x (LIBTORCH; this one is " +
                           std::string(TORCH_VERSION) + ")");
}

#endif

}  // namespace prime
