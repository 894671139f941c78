// train.nonfinite: a step whose loss, z-loss or gradient norm is not finite ends the run, naming the last
// checkpoint ("stop", the default), or is skipped without an update ("skip").
#include <cmath>
#include <cstdio>

#include "archspace/train/callbacks/callbacks.h"
#include "archspace/train/checkpoint.h"
#include "archspace/train/trainer.h"
#include "archspace/util/error.h"

namespace archspace {

namespace {

class NonfinitePolicyCallback final : public TrainCallback {
 public:
  std::string name() const override { return "nonfinite_policy"; }

  bool pre_optim_step(Trainer& t, int64_t step, StepStats& stats) override {
    if (std::isfinite(stats.loss) && std::isfinite(stats.z_loss) && std::isfinite(stats.grad_norm)) return true;
    char what[160];
    std::snprintf(what, sizeof(what), "step %lld: the loss is %g (z-loss %g, gradient norm %g)",
                  static_cast<long long>(step + 1), stats.loss, stats.z_loss, stats.grad_norm);
    if (!t.config().skip_nonfinite_steps) {
      if (t.metrics()) t.metrics()->write({{"step", step + 1}, {"diverged", true}});
      const std::string latest = latest_checkpoint(t.config().run_dir);
      throw Error(std::string(what) + ": training diverged; nothing of this step was saved (the last checkpoint is " +
                  (latest.empty() ? std::string("none") : latest) +
                  "). Lower optim.lr, or set train.nonfinite = \"skip\"");
    }
    t.progress().note(std::string(what) + ": skipped (train.nonfinite = \"skip\")");
    return false;
  }
};

}  // namespace

std::unique_ptr<TrainCallback> make_nonfinite_policy_callback(const Trainer&) {
  return std::make_unique<NonfinitePolicyCallback>();
}

}  // namespace archspace
