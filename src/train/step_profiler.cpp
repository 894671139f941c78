#include "archspace/train/step_profiler.h"

#include <filesystem>

namespace archspace {

StepProfiler::StepProfiler(const std::vector<int64_t>& steps, const std::string& run_dir, int rank)
    : run_dir_(run_dir), rank_(rank) {
  if (steps.size() == 2) {
    first_ = steps[0];
    last_ = steps[1];
  }
}

StepProfiler::~StepProfiler() {
  if (!running_) return;
  try {
    running_->finish();
  } catch (...) {  // the run's own error (if any) is the one to report
  }
}

std::string StepProfiler::trace_path() const {
  return (std::filesystem::path(run_dir_) / "profile" /
          ("steps-" + std::to_string(first_) + "-" + std::to_string(last_)) /
          ("rank" + std::to_string(rank_) + ".pt.trace.json"))
      .string();
}

void StepProfiler::before_step(int64_t step) {
  if (first_ == 0 || running_) return;
  const int64_t n = step + 1;
  if (n >= first_ && n <= last_) running_ = std::make_unique<OpProfiler>(trace_path());
}

std::optional<ProfileSummary> StepProfiler::after_step(int64_t step) {
  if (!running_ || step + 1 < last_) return std::nullopt;
  ProfileSummary summary = running_->finish();
  running_.reset();
  return summary;
}

}  // namespace archspace
