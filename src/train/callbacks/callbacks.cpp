// The registry of the training callbacks: one line per callback, in the order of their side effects.
#include "archspace/train/callbacks/callbacks.h"

#include "archspace/train/trainer.h"

namespace archspace {

void register_callbacks(TrainCallbacks& callbacks, Trainer& trainer) {
  const TrainConfig& cfg = trainer.config();
  if (!cfg.profile_steps.empty()) callbacks.add(make_profiler_callback());
  callbacks.add(make_metrics_log_callback());
  callbacks.add(make_progress_callback());
  if (cfg.dump_gradients_steps > 0) callbacks.add(make_gradient_dump_callback());
  callbacks.add(make_nonfinite_policy_callback());
  callbacks.add(make_spike_policy_callback(trainer));  // always: checkpoints carry its window
  if (!cfg.downstream.empty()) callbacks.add(make_downstream_evaluation_callback(trainer));
  if (!trainer.validation_sets().empty()) callbacks.add(make_validation_callback());
  callbacks.add(make_checkpointing_callback());
}

bool evaluation_step(const Trainer& trainer, int64_t step) {
  return every_interval(trainer.config().eval_interval, step + 1) || step + 1 == trainer.config().max_steps;
}

}  // namespace archspace
