// What happens around the training step, as callbacks (modelled on OLMo-core's trainer callbacks): checkpoints,
// validation, downstream evaluation, the metrics log and its trackers, the progress line, the stability policies,
// gradient dumps and profiling are each one TrainCallback in a file of its own under train/callbacks/, registered
// at setup from the config (train/callbacks/callbacks.h, register_callbacks). The trainer calls every callback's
// hook in registration order, so that order is the order of their side effects (metrics.jsonl lines, notes).
//
// Adding one: a class deriving from TrainCallback in src/train/callbacks/NAME.cpp that overrides the hooks it
// needs, and one line in register_callbacks (docs/layout.md, "Where the next capability lands: a callback").
#pragma once

#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace archspace {

class Trainer;
struct StepStats;

class TrainCallback {
 public:
  virtual ~TrainCallback() = default;

  // Its name, for messages and tests.
  virtual std::string name() const = 0;

  // After resume and the ranks' synchronisation, before the first step of this call (also when the run is
  // already finished and no step will run). Every rank.
  virtual void on_start(Trainer&) {}
  // Before the step `step` (0-based) runs and before its time is measured.
  virtual void pre_step(Trainer&, int64_t /*step*/) {}
  // The step's gradients are complete (reduced over the ranks), before they are measured and clipped. Collective
  // work is allowed here (every rank calls it).
  virtual void post_backward(Trainer&, int64_t /*step*/) {}
  // After clipping, before the optimizer's step, with the step's global loss and gradient norm (the same on every
  // rank, so every rank decides the same). Returning false skips the update (the gradients are dropped, stats.skipped
  // is set and the later callbacks' pre_optim_step are not called); throwing ends the run through on_error.
  virtual bool pre_optim_step(Trainer&, int64_t /*step*/, StepStats&) { return true; }
  // After the step (taken or skipped): `seconds` is its wall time. Evaluations and checkpoints run here.
  virtual void post_step(Trainer&, int64_t /*step*/, const StepStats&, double /*seconds*/) {}
  // The run stops after step `step` because a signal asked it to (SIGINT or SIGTERM; every rank agreed): what must
  // not be lost is saved here (the checkpointing callback's checkpoint of step + 1). Called before post_train.
  virtual void on_stop_signal(Trainer&, int64_t /*step*/, int /*signal*/) {}
  // After a checkpoint of `step` (the number of steps it holds) was written (rank 0) or waited for (the others).
  virtual void post_checkpoint_saved(Trainer&, int64_t /*step*/, const std::string& /*path*/) {}
  // After the last step of this call (the run finished, was stopped by a signal or by --stop-after).
  virtual void post_train(Trainer&) {}
  // The run is ending with `error` (thrown by a step or a hook); the trainer rethrows it after every callback.
  virtual void on_error(Trainer&, const std::exception&) {}

  // What a checkpoint keeps of the callback, and what a resumed run reads back (the same object).
  virtual void save_state(nlohmann::json& /*trainer_state*/) const {}
  virtual void load_state(const nlohmann::json& /*trainer_state*/) {}
};

// The callbacks of a run, called in registration order.
class TrainCallbacks {
 public:
  void add(std::unique_ptr<TrainCallback> callback) { callbacks_.push_back(std::move(callback)); }
  const std::vector<std::unique_ptr<TrainCallback>>& all() const { return callbacks_; }
  // The registered callback of type T, or null.
  template <typename T>
  T* find() const {
    for (const auto& c : callbacks_)
      if (auto* t = dynamic_cast<T*>(c.get())) return t;
    return nullptr;
  }

  void on_start(Trainer& t);
  void pre_step(Trainer& t, int64_t step);
  void post_backward(Trainer& t, int64_t step);
  bool pre_optim_step(Trainer& t, int64_t step, StepStats& stats);  // false: some callback skipped the update
  void post_step(Trainer& t, int64_t step, const StepStats& stats, double seconds);
  void on_stop_signal(Trainer& t, int64_t step, int signal);
  void post_checkpoint_saved(Trainer& t, int64_t step, const std::string& path);
  void post_train(Trainer& t);
  void on_error(Trainer& t, const std::exception& error);  // every callback, even when one of them throws
  void save_state(nlohmann::json& state) const;
  void load_state(const nlohmann::json& state);

 private:
  std::vector<std::unique_ptr<TrainCallback>> callbacks_;
};

}  // namespace archspace
