// train.spike: a loss above spike_factor x the median of the last spike_window losses (train/stability.h) is
// recorded ("record"), skipped without an update ("skip"), or ends the run ("stop"). Checkpoints carry the
// window ("recent_losses"), so a resumed run flags exactly the steps an uninterrupted one would.
#include <cstdio>

#include "archspace/train/callbacks/callbacks.h"
#include "archspace/train/checkpoint.h"
#include "archspace/train/stability.h"
#include "archspace/train/trainer.h"
#include "archspace/util/error.h"

namespace archspace {

namespace {

class SpikePolicyCallback final : public TrainCallback {
 public:
  explicit SpikePolicyCallback(const TrainConfig& cfg) : spikes_(cfg.spike_factor, cfg.spike_window) {}

  std::string name() const override { return "spike_policy"; }

  bool pre_optim_step(Trainer& t, int64_t step, StepStats& stats) override {
    const TrainConfig& cfg = t.config();
    stats.spike_baseline = spikes_.check(stats.loss);
    spikes_.accept(stats.loss);  // spikes too, as the sweep's rule does
    if (!stats.spike_baseline) return true;
    char what[200];
    std::snprintf(what, sizeof(what), "step %lld: loss spike: %.4f > %g x %.4f (the median of the last %lld losses)",
                  static_cast<long long>(step + 1), stats.loss, cfg.spike_factor, *stats.spike_baseline,
                  static_cast<long long>(cfg.spike_window));
    if (cfg.spike_policy == "stop") {
      if (t.metrics()) t.metrics()->write(spike_line(t, step, stats));
      const std::string latest = latest_checkpoint(cfg.run_dir);
      throw Error(std::string(what) + ": training stopped (train.spike = \"stop\"); nothing of this step was saved " +
                  "(the last checkpoint is " + (latest.empty() ? std::string("none") : latest) + ")");
    }
    if (cfg.spike_policy == "skip") {
      t.progress().note(std::string(what) + ": skipped (train.spike = \"skip\")");
      return false;
    }
    t.progress().note(what);
    return true;
  }

  void save_state(nlohmann::json& state) const override { state["recent_losses"] = spikes_.state(); }
  void load_state(const nlohmann::json& state) override {
    if (state.contains("recent_losses")) spikes_.restore(state.at("recent_losses"));
  }

 private:
  SpikeDetector spikes_;
};

}  // namespace

std::unique_ptr<TrainCallback> make_spike_policy_callback(const Trainer& trainer) {
  return std::make_unique<SpikePolicyCallback>(trainer.config());
}

}  // namespace archspace
