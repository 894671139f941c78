#include "archspace/train/metrics_log.h"

#include <iostream>
#include <vector>

#include "archspace/util/error.h"
#include "archspace/util/json_file.h"

namespace archspace {

using nlohmann::json;

MetricsLog::MetricsLog(const std::string& path, int64_t resume_step, std::vector<std::unique_ptr<Tracker>> trackers,
                       Warn warn)
    : path_(path), trackers_(std::move(trackers)), warn_(std::move(warn)) {
  if (!warn_) warn_ = [](const std::string& m) { std::cerr << "warning: " << m << "\n"; };
  std::vector<std::string> keep;
  {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      try {
        if (parse_json_text(line, path).at("step").get<int64_t>() <= resume_step) keep.push_back(line);
      } catch (const std::exception&) {
        // A line cut short by a kill: not a step of the run.
      }
    }
  }
  std::ofstream rewrite(path, std::ios::trunc);
  for (const auto& l : keep) rewrite << l << "\n";
  rewrite.close();
  if (!rewrite) throw Error(path + ": cannot write");
  out_.open(path, std::ios::app);
  if (!out_) throw Error(path + ": cannot open for appending");
}

void MetricsLog::write(const json& line) {
  out_ << line.dump() << "\n" << std::flush;
  // A full disk must stop the run with a message, not leave a curve that silently ends.
  if (!out_) throw Error(path_ + ": write failed (disk full?); the metrics of this step are lost");
  for (size_t i = 0; i < trackers_.size();) {
    try {
      trackers_[i]->write(line);
      ++i;
    } catch (const std::exception& e) {
      drop(i, e);
    }
  }
}

void MetricsLog::finish() {
  for (size_t i = 0; i < trackers_.size();) {
    try {
      trackers_[i]->finish();
      ++i;
    } catch (const std::exception& e) {
      drop(i, e);
    }
  }
  trackers_.clear();
}

// A tracker never stops training: one warning, and the rest of the run goes to metrics.jsonl alone.
void MetricsLog::drop(size_t i, const std::exception& e) {
  warn_(trackers_[i]->name() + " tracking stopped: " + e.what() + "; metrics.jsonl stays the record");
  trackers_.erase(trackers_.begin() + static_cast<std::ptrdiff_t>(i));
}

}  // namespace archspace
