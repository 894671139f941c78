// train.profile_steps = [a, b]: a Kineto trace (util/profiler.h) of training steps a..b (1-based, inclusive,
// as metrics.jsonl counts them) on every rank, in RUN_DIR/profile/steps-A-B/rankR.pt.trace.json with its
// top-ops table beside it. torchtitan and torch.profiler's schedule do the same: a few steps after warm-up,
// not the whole run (a trace grows by megabytes per step).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "archspace/util/profiler.h"

namespace archspace {

// One step's cost as the trainer saw it: wall seconds and the process's page faults during the step.
struct StepCost {
  double seconds = 0;
  int64_t page_faults = 0;
};

// "traced steps 6-9: 2.737 s and 78668 page faults a step (median); the 5 untraced steps before them: 2.245 s and
// 2628 page faults": what tracing cost the steps it traced, so a table read from them can be weighed (a traced
// step that faults in pages an untraced one reuses runs ops such as copy_ slower than the training does).
// Without untraced steps before the window (it starts at step 1, or a resumed run starts inside it) only the
// traced steps are described.
std::string traced_step_comparison(int64_t first, int64_t last, const std::vector<StepCost>& traced,
                                   const std::vector<StepCost>& untraced_before);

class StepProfiler {
 public:
  // `steps` empty: off. Else exactly [a, b] with 1 <= a <= b (train_config checks it).
  StepProfiler(const std::vector<int64_t>& steps, const std::string& run_dir, int rank);
  ~StepProfiler();  // a run that stops inside the window still writes what it traced

  // Around each step (0-based `step`, the one about to run / just run). A resumed run that starts inside the
  // window traces the steps that remain.
  void before_step(int64_t step);
  // The summary when this step closed the window; `seconds`: the step's wall time, as metrics.jsonl has it.
  std::optional<ProfileSummary> after_step(int64_t step, double seconds);

  std::string trace_path() const;
  // After the window closed: traced_step_comparison of its steps and the untraced steps before it.
  std::string comparison() const { return traced_step_comparison(first_, last_, traced_, untraced_before_); }

 private:
  int64_t first_ = 0, last_ = 0;  // 1-based; 0: off
  std::string run_dir_;
  int rank_ = 0;
  std::unique_ptr<OpProfiler> running_;
  int64_t faults_before_step_ = 0;
  std::vector<StepCost> traced_;
  std::vector<StepCost> untraced_before_;  // the last kUntracedKept steps before the window
  static constexpr size_t kUntracedKept = 20;
};

}  // namespace archspace
