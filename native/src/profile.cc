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
#else
#include <torch/csrc/autograd/profiler_legacy.h>
#endif

namespace prime {

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

// Writes <prefix>.txt through a temporary file: the header line, then the tables.
void writeTables(const std::string& prefix, const std::string& head,
                 const std::vector<std::pair<std::string, const std::map<std::string, Total>*>>& tables) {
  const std::string txt = prefix + ".txt", tmp = txt + ".tmp";
  {
    std::ofstream out(tmp);
    out << head;
    for (const auto& [title, byName] : tables) table(out, title, *byName, 40);
    if (!out) throw std::runtime_error("profile: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), txt.c_str()) != 0) throw std::runtime_error("profile: cannot write " + txt);
}

double msSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

#if TORCH_VERSION_MAJOR >= 2

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
  const double wallMs = msSince(t0);
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result = torch::autograd::profiler::disableProfiler();
  std::map<std::string, Total> kernels, ops;
  for (const auto& e : result->events()) {
    Total& t = (e.deviceType() == c10::DeviceType::CUDA ? kernels : ops)[e.name()];
    t.ns += e.durationNs();
    t.calls++;
  }
  uint64_t deviceNs = 0;
  for (const auto& [name, t] : kernels) deviceNs += t.ns;
  char head[200];
  snprintf(head, sizeof head, "wall %.3f ms; device busy (kernels and copies, summed) %.3f ms\n", wallMs,
           double(deviceNs) / 1e6);
  if (device.is_cuda())
    writeTables(prefix, head, {{"CUDA kernels and copies", &kernels}, {"CPU operators (inclusive)", &ops}});
  else writeTables(prefix, head, {{"CPU operators (inclusive)", &ops}});
  result->save(prefix + ".json");
}

#else

// libtorch 1.x (Debian's, the CPU build): the legacy profiler, CPU operators only, on the calling
// thread (autograd's CPU backward runs there too). Each operator's time inclusive of the operators
// it called, and its self time (without them: what torch.profiler's table sorts by).
void profiled(const std::string& prefix, const at::Device& device, const std::function<void()>& work) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  if (!device.is_cpu())
    throw std::runtime_error("profile: on " + device.str() +
                             " needs the addon built against libtorch 2.x (LIBTORCH; this one is " +
                             std::string(TORCH_VERSION) + ")");
  prof::enableProfilerLegacy(ProfilerConfig(ProfilerState::CPU));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    work();
  } catch (...) {
    prof::disableProfilerLegacy();
    throw;
  }
  const double wallMs = msSince(t0);
  prof::thread_event_lists lists = prof::disableProfilerLegacy();
  std::map<std::string, Total> inclusive, self;
  std::vector<prof::LegacyEvent*> all;
  for (auto& list : lists) {
    // A range's pop matches the latest open push of its handle (ranges nest within a thread).
    struct Open {
      prof::LegacyEvent* push;
      double childUs = 0;
    };
    std::vector<Open> open;
    for (prof::LegacyEvent& e : list) {
      all.push_back(&e);
      if (e.kind() == prof::EventKind::PushRange) {
        open.push_back({&e});
      } else if (e.kind() == prof::EventKind::PopRange) {
        size_t i = open.size();
        while (i > 0 && open[i - 1].push->handle() != e.handle()) i--;
        if (i == 0) continue;  // its push was before the profile began
        const Open o = open[i - 1];
        open.resize(i - 1);
        const double us = o.push->cpuElapsedUs(e);
        Total &in = inclusive[o.push->name()], &own = self[o.push->name()];
        in.ns += uint64_t(us * 1e3);
        in.calls++;
        own.ns += uint64_t(std::max(0.0, us - o.childUs) * 1e3);
        own.calls++;
        if (!open.empty()) open.back().childUs += us;
      }
    }
  }
  char head[200];
  snprintf(head, sizeof head,
           "wall %.3f ms; device busy 0.000 ms: CPU operators only (libtorch 1.x's legacy profiler)\n", wallMs);
  writeTables(prefix, head, {{"CPU operators (self)", &self}, {"CPU operators (inclusive)", &inclusive}});
  const std::string json = prefix + ".json", tmp = json + ".tmp";
  {
    std::ofstream out(tmp);
    prof::writeProfilerEventsToStream(out, all);
    if (!out) throw std::runtime_error("profile: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), json.c_str()) != 0) throw std::runtime_error("profile: cannot write " + json);
}

#endif

}  // namespace prime
