// A step's metrics by name, in the order they were set. The names are the ones a run records
// (metrics.jsonl, snake_case): the addon hands them to JS as they are (addon/convert.cc
// metricsToJs) and the trainer passes them on, so a new metric is one set() where it is computed
// (plus, in TS, wherever it is shown).
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace prime {

class Metrics {
 public:
  // Sets `name`; a name set again keeps its place and takes the new value.
  void set(const std::string& name, double value) {
    for (auto& [n, v] : entries_)
      if (n == name) {
        v = value;
        return;
      }
    entries_.emplace_back(name, value);
  }
  // The value of `name`; throws naming it when it was never set.
  double get(const std::string& name) const {
    for (const auto& [n, v] : entries_)
      if (n == name) return v;
    throw std::runtime_error("no metric '" + name + "'");
  }
  const std::vector<std::pair<std::string, double>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, double>> entries_;
};

}  // namespace prime
