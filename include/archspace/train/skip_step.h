// OLMo-core's step skipping (olmo_core/optim/skip_step_optimizer.py, SkipStepOptimizer.get_step_factor, as
// SkipStepAdamW uses it and OLMo 3 trained with it): every step's cross-entropy loss and (when clipping is on, as
// TransformerTrainModule only records it then) its gradient norm before clipping join a window of the last
// window + 1 values, skipped steps included. Once the window holds max(2, window / 2) values, a step is skipped
// when its loss, or its gradient norm, exceeds the mean of the earlier values in the window by more than sigma
// (unbiased) standard deviations. The statistics are fp32, as OLMo-core's tensors are; a comparison with NaN
// skips, as there. A skipped step changes nothing: no weight decay, no moment update, the optimizer's step count
// unchanged (SkipStepAdamW with step_increment_bugfix), while the schedule's step advances.
#pragma once

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>

namespace archspace {

class SkipStepRule {
 public:
  SkipStepRule(int64_t window, double sigma, bool use_grad_norms)
      : window_(window), sigma_(sigma), use_grad_norms_(use_grad_norms) {}

  struct Verdict {
    bool skip = false;
    bool checked = false;  // enough values were seen to judge
    float loss_mean = 0, loss_std = 0, grad_norm_mean = 0, grad_norm_std = 0;
  };
  // Adds the step's values to the window, then judges the step.
  Verdict observe(double loss, double grad_norm);

  // The window, for checkpoints: a resumed run skips exactly the steps an uninterrupted one would.
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);

 private:
  int64_t window_;
  double sigma_;
  bool use_grad_norms_;
  std::deque<float> losses_, grad_norms_;
};

}  // namespace archspace
