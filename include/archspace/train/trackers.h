// Experiment trackers: sinks of the metrics.jsonl record ([log] in the training config; docs/training.md,
// "Tracking"). MetricsLog writes each line to metrics.jsonl first and then hands it to every tracker, so a
// tracker that fails (a package missing, a sidecar that died, a full disk) is warned about once and dropped
// while training and metrics.jsonl go on. Rank 0 alone builds trackers, as it alone writes metrics.jsonl.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/config/train_config.h"

namespace archspace {

class Tracker {
 public:
  virtual ~Tracker() = default;
  // For warnings: "TensorBoard", "W&B".
  virtual std::string name() const = 0;
  // One metrics.jsonl line ({"step": N, ...}). Throws (any std::exception) when the tracker cannot go on.
  virtual void write(const nlohmann::json& record) = 0;
  // The run ended normally: the last data (plots) out, files closed. Throws like write().
  virtual void finish() {}
};

// What a tracker knows of the run besides its records.
struct TrackingContext {
  std::string run_dir;
  int64_t start_step = 0;   // >0: a resumed run, whose records start after this step
  std::string config_text;  // the configuration as run (TOML)
  nlohmann::json run_info;  // derived facts worth seeing next to the config (world size, global batch, ...)
};

// The trackers [log] asks for. One that cannot start is not returned: `warn` gets one line naming it and why.
std::vector<std::unique_ptr<Tracker>> make_trackers(const LogConfig& log, const TrackingContext& context,
                                                    const std::function<void(const std::string&)>& warn);

// A metrics line as tracker scalars: nested objects and arrays flattened with "/" ("downstream/arc_easy/value",
// "grad_norms/layers.0"), "step" left out (it is the x axis), nulls left out.
nlohmann::json flatten_record(const nlohmann::json& record);

}  // namespace archspace
