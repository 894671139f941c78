// RUN_DIR/metrics.jsonl: one JSON object per line with a "step" field (training lines and validation
// lines). Opening it for a run that (re)starts at step S drops every line beyond S, and any torn line a
// kill left, so that a resumed run's curve has each step exactly once. Each line then goes to the run's
// experiment trackers (train/trackers.h); metrics.jsonl stays the record when one of them fails.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/train/trackers.h"

namespace archspace {

class MetricsLog {
 public:
  using Warn = std::function<void(const std::string&)>;

  // Keeps the lines with step <= `resume_step` (0: a fresh run keeps none), then appends. `warn` gets the one
  // line about a tracker that failed (it is then dropped).
  MetricsLog(const std::string& path, int64_t resume_step, std::vector<std::unique_ptr<Tracker>> trackers = {},
             Warn warn = {});

  // Appends one line and flushes it (a crash loses at most the line being written), then hands it to each tracker.
  void write(const nlohmann::json& line);
  // The run ended normally: each tracker's finish (plots, closing the W&B run).
  void finish();

  const std::string& path() const { return path_; }

 private:
  void drop(size_t i, const std::exception& e);

  std::string path_;
  std::ofstream out_;
  std::vector<std::unique_ptr<Tracker>> trackers_;
  Warn warn_;
};

}  // namespace archspace
