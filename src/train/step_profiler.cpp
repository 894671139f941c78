#include "archspace/train/step_profiler.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace archspace {

namespace {
template <typename T>
T median_of(std::vector<T> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::string described(const std::vector<StepCost>& steps) {
  std::vector<double> seconds;
  std::vector<int64_t> faults;
  for (const StepCost& s : steps) {
    seconds.push_back(s.seconds);
    faults.push_back(s.page_faults);
  }
  char text[96];
  std::snprintf(text, sizeof(text), "%.3f s and %lld page faults", median_of(seconds),
                static_cast<long long>(median_of(faults)));
  return text;
}
}  // namespace

std::string traced_step_comparison(int64_t first, int64_t last, const std::vector<StepCost>& traced,
                                   const std::vector<StepCost>& untraced_before) {
  if (traced.empty()) return "";
  std::string out = "traced steps " + std::to_string(first) + "-" + std::to_string(last) + ": " + described(traced) +
                    (traced.size() > 1 ? " a step (median)" : "");
  if (!untraced_before.empty())
    out += "; the " + std::to_string(untraced_before.size()) + " untraced step" +
           (untraced_before.size() > 1 ? "s" : "") + " before them: " + described(untraced_before);
  return out;
}

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
  if (first_ == 0) return;
  const int64_t n = step + 1;
  if (!running_ && n >= first_ && n <= last_) running_ = std::make_unique<OpProfiler>(trace_path());
  faults_before_step_ = process_page_faults();
}

std::optional<ProfileSummary> StepProfiler::after_step(int64_t step, double seconds) {
  if (first_ == 0) return std::nullopt;
  const StepCost cost{seconds, process_page_faults() - faults_before_step_};
  if (running_)
    traced_.push_back(cost);
  else if (step + 1 < first_) {
    if (untraced_before_.size() == kUntracedKept) untraced_before_.erase(untraced_before_.begin());
    untraced_before_.push_back(cost);
  }
  if (!running_ || step + 1 < last_) return std::nullopt;
  ProfileSummary summary = running_->finish();
  running_.reset();
  return summary;
}

}  // namespace archspace
