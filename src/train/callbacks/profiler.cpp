// train.profile_steps = [a, b]: a Kineto trace of steps a..b on every rank (train/step_profiler.h), and its
// top-ops table as a note on rank 0 when the window closes.
#include <optional>

#include "archspace/train/callbacks/callbacks.h"
#include "archspace/train/step_profiler.h"
#include "archspace/train/trainer.h"

namespace archspace {

namespace {

class ProfilerCallback final : public TrainCallback {
 public:
  std::string name() const override { return "profiler"; }

  void on_start(Trainer& t) override { profiler_.emplace(t.config().profile_steps, t.config().run_dir, t.rank()); }
  void pre_step(Trainer&, int64_t step) override { profiler_->before_step(step); }
  void post_step(Trainer& t, int64_t step, const StepStats&, double seconds) override {
    const std::vector<int64_t>& steps = t.config().profile_steps;
    if (auto traced = profiler_->after_step(step, seconds); traced && t.rank() == 0)
      t.progress().note("profile of steps " + std::to_string(steps[0]) + "-" + std::to_string(steps[1]) + ": " +
                        traced->trace_path + " (every rank beside it)\n" + traced->table + profiler_->comparison() +
                        "\n");
  }
  // A run that stops inside the window still writes what it traced.
  void post_train(Trainer&) override { profiler_.reset(); }
  void on_error(Trainer&, const std::exception&) override { profiler_.reset(); }

 private:
  std::optional<StepProfiler> profiler_;
};

}  // namespace

std::unique_ptr<TrainCallback> make_profiler_callback(const Trainer& trainer) {
  if (trainer.config().profile_steps.empty()) return nullptr;
  return std::make_unique<ProfilerCallback>();
}

}  // namespace archspace
