// The training callbacks (train/callback.h), one file each under src/train/callbacks/, and the registry that
// builds a run's list from its config. Registration order is the order of their side effects: in each step the
// profiler, the metrics line, the progress line, downstream evaluation, validation, then the checkpoint; before
// the update the non-finite policy, then the spike policy.
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

// train.profile_steps: a Kineto trace of the steps (train/step_profiler.h).
std::unique_ptr<TrainCallback> make_profiler_callback();
// metrics.jsonl on rank 0 and its trackers ([log]): one line per step, with its spike, skip and gradient-norm lines.
std::unique_ptr<TrainCallback> make_metrics_log_callback();
// The progress line: "step N/M | loss | lr | grad | tok/s".
std::unique_ptr<TrainCallback> make_progress_callback();
// train.dump_gradients_steps: RUN/debug/grads-step-N.safetensors.
std::unique_ptr<TrainCallback> make_gradient_dump_callback();
// train.nonfinite: a non-finite loss or gradient norm stops the run ("stop") or skips the update ("skip").
std::unique_ptr<TrainCallback> make_nonfinite_policy_callback();
// train.spike / spike_factor / spike_window: loss spikes recorded, skipped or stopping the run.
std::unique_ptr<TrainCallback> make_spike_policy_callback(const Trainer& trainer);
// eval.downstream: the downstream tasks, read and tokenized at setup, scored at each evaluation step.
std::unique_ptr<TrainCallback> make_downstream_evaluation_callback(const Trainer& trainer);
// data.valid and [[eval.sources]]: validation losses at each evaluation step.
std::unique_ptr<TrainCallback> make_validation_callback();
// train.checkpoint_interval and the last step: checkpoints (Trainer::save_checkpoint).
std::unique_ptr<TrainCallback> make_checkpointing_callback();

}  // namespace archspace
