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

class StepProfiler {
 public:
  // `steps` empty: off. Else exactly [a, b] with 1 <= a <= b (train_config checks it).
  StepProfiler(const std::vector<int64_t>& steps, const std::string& run_dir, int rank);
  ~StepProfiler();  // a run that stops inside the window still writes what it traced

  // Around each step (0-based `step`, the one about to run / just run). A resumed run that starts inside the
  // window traces the steps that remain.
  void before_step(int64_t step);
  // The summary when this step closed the window.
  std::optional<ProfileSummary> after_step(int64_t step);

  std::string trace_path() const;

 private:
  int64_t first_ = 0, last_ = 0;  // 1-based; 0: off
  std::string run_dir_;
  int rank_ = 0;
  std::unique_ptr<OpProfiler> running_;
};

}  // namespace archspace
