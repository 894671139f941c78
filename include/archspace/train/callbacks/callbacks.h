// The training callbacks (train/callback.h), one file each under src/train/callbacks/, and the registry that
// builds a run's list from its config (ARCHSPACE_TRAIN_CALLBACKS below). Registration order is the order of their side
// effects: in each step the profiler, the metrics line, the progress line, downstream evaluation, validation, then the
// checkpoint; before the update the non-finite policy, OLMo-core's step skipping, then the spike policy.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "archspace/train/callback.h"

namespace archspace {

class Trainer;

// The callbacks of `trainer`'s config, in order, into `callbacks` (at setup, after the data, before the gradient
// strategy: a callback's own setup, e.g. reading the downstream tasks, fails before any collective).
void register_callbacks(TrainCallbacks& callbacks, Trainer& trainer);

inline bool every_interval(int64_t interval, int64_t step) { return interval > 0 && step % interval == 0; }
// The steps (1-based `step + 1`) that evaluate: every eval.interval steps, and the last.
bool evaluation_step(const Trainer& trainer, int64_t step);
// The metrics.jsonl line of a loss spike (the metrics log writes it after the step's line; train.spike = "stop"
// writes it before it stops).
nlohmann::json spike_line(const Trainer& trainer, int64_t step, const StepStats& stats);

// Every callback, one line each, in registration order: X(name) is the factory make_<name>_callback(trainer), defined
// in src/train/callbacks/<name>.cpp, which returns the callback or null when the run's config does not ask for it.
// Adding a callback is its file plus its line here (CMakeLists.txt takes every file of src/train/callbacks/).
//   profiler               train.profile_steps: a Kineto trace of the steps (train/step_profiler.h)
//   metrics_log            metrics.jsonl on rank 0 and its trackers ([log]): a line per step, with its spike, skip
//                          and gradient-norm lines
//   progress               the progress line: "step N/M | loss | lr | grad | tok/s"
//   gradient_dump          train.dump_gradients_steps: RUN/debug/grads-step-N.safetensors
//   nonfinite_policy       train.nonfinite: a non-finite loss or gradient norm stops the run or skips the update
//   skip_step              optim.skip_steps: OLMo-core's SkipStepAdamW rule skips an update whose loss or gradient
//                          norm exceeds the recent mean by skip_step_sigma standard deviations (train/skip_step.h)
//   spike_policy           train.spike / spike_factor / spike_window: loss spikes recorded, skipped or stopping the
//                          run (always registered: checkpoints carry its window)
//   downstream_evaluation  eval.downstream: the tasks, read and tokenized at setup, run at each evaluation step
//   validation             data.valid and [[eval.sources]]: validation losses at each evaluation step
//   checkpointing          train.checkpoint_interval and the last step: checkpoints (Trainer::save_checkpoint)
#define ARCHSPACE_TRAIN_CALLBACKS(X) \
  X(profiler)                        \
  X(metrics_log)                     \
  X(progress)                        \
  X(gradient_dump)                   \
  X(nonfinite_policy)                \
  X(skip_step)                       \
  X(spike_policy)                    \
  X(downstream_evaluation)           \
  X(validation)                      \
  X(checkpointing)

#define ARCHSPACE_DECLARE_TRAIN_CALLBACK(name) \
  std::unique_ptr<TrainCallback> make_##name##_callback(const Trainer& trainer);
ARCHSPACE_TRAIN_CALLBACKS(ARCHSPACE_DECLARE_TRAIN_CALLBACK)
#undef ARCHSPACE_DECLARE_TRAIN_CALLBACK

}  // namespace archspace
