// optim.skip_steps: OLMo-core's SkipStepAdamW rule (train/skip_step.h) skips an update whose loss or gradient norm is
// far above the recent ones. Checkpoints carry its window ("skip_step_window"), so a resumed run skips exactly the
// steps an uninterrupted one would.
#include "archspace/train/skip_step.h"

#include <cstdio>

#include "archspace/train/callbacks/callbacks.h"
#include "archspace/train/trainer.h"

namespace archspace {

namespace {

class SkipStepCallback final : public TrainCallback {
 public:
  explicit SkipStepCallback(const TrainConfig& cfg)
      : rule_(cfg.skip_step_window, cfg.skip_step_sigma, /*use_grad_norms=*/cfg.clip_grad_norm > 0) {}

  std::string name() const override { return "skip_step"; }

  bool pre_optim_step(Trainer& t, int64_t step, StepStats& stats) override {
    const SkipStepRule::Verdict v = rule_.observe(stats.loss, stats.grad_norm);
    if (!v.skip) return true;
    const TrainConfig& cfg = t.config();
    char what[320];
    std::snprintf(what, sizeof(what),
                  "step %lld: loss %.4f (mean %.4f, std %.4f) or gradient norm %.4f (mean %.4f, std %.4f) above "
                  "mean + %g std of the last %lld steps: skipped (optim.skip_steps, OLMo-core's SkipStepAdamW rule)",
                  static_cast<long long>(step + 1), stats.loss, v.loss_mean, v.loss_std, stats.grad_norm,
                  v.grad_norm_mean, v.grad_norm_std, cfg.skip_step_sigma, static_cast<long long>(cfg.skip_step_window));
    t.progress().note(what);
    return false;
  }

  void save_state(nlohmann::json& state) const override { state["skip_step_window"] = rule_.state(); }
  void load_state(const nlohmann::json& state) override {
    if (state.contains("skip_step_window")) rule_.restore(state.at("skip_step_window"));
  }

 private:
  SkipStepRule rule_;
};

}  // namespace

std::unique_ptr<TrainCallback> make_skip_step_callback(const Trainer& trainer) {
  if (!trainer.config().skip_steps) return nullptr;
  return std::make_unique<SkipStepCallback>(trainer.config());
}

}  // namespace archspace
