// RUN_DIR/metrics.jsonl: one JSON object per line with a "step" field (training lines and validation
// lines). Opening it for a run that (re)starts at step S drops every line beyond S, and any torn line a
// kill left, so that a resumed run's curve has each step exactly once.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace archspace {

class MetricsLog {
 public:
  // Keeps the lines with step <= `resume_step` (0: a fresh run keeps none), then appends.
  MetricsLog(const std::string& path, int64_t resume_step);

  // Appends one line and flushes it (a crash loses at most the line being written).
  void write(const nlohmann::json& line);

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace archspace
