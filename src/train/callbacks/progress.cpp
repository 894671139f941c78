// The progress line of each step: "step N/M | loss | lr | grad | tok/s", with the run's share done.
#include <cstdio>

#include "archspace/train/callbacks/callbacks.h"
#include "archspace/train/trainer.h"

namespace archspace {

namespace {

class ProgressCallback final : public TrainCallback {
 public:
  std::string name() const override { return "progress"; }

  void post_step(Trainer& t, int64_t step, const StepStats& s, double step_seconds) override {
    const int64_t max_steps = t.config().max_steps;
    const int64_t done = step + 1 - t.start_step(), total = max_steps - t.start_step();
    char what[192];
    std::snprintf(what, sizeof(what), "step %lld/%lld | loss %.4f | lr %.2e | grad %.3f | %.0f tok/s",
                  static_cast<long long>(step + 1), static_cast<long long>(max_steps), s.loss, s.lr, s.grad_norm,
                  static_cast<double>(t.global_batch() * t.config().sequence_length) / step_seconds);
    t.progress().update(what, static_cast<double>(done) / static_cast<double>(total), done == 1 || done == total);
  }
};

}  // namespace

std::unique_ptr<TrainCallback> make_progress_callback(const Trainer&) { return std::make_unique<ProgressCallback>(); }

}  // namespace archspace
