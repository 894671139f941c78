#include "archspace/train/callback.h"

namespace archspace {

void TrainCallbacks::on_start(Trainer& t) {
  for (auto& c : callbacks_) c->on_start(t);
}

void TrainCallbacks::pre_step(Trainer& t, int64_t step) {
  for (auto& c : callbacks_) c->pre_step(t, step);
}

void TrainCallbacks::post_backward(Trainer& t, int64_t step) {
  for (auto& c : callbacks_) c->post_backward(t, step);
}

bool TrainCallbacks::pre_optim_step(Trainer& t, int64_t step, StepStats& stats) {
  for (auto& c : callbacks_)
    if (!c->pre_optim_step(t, step, stats)) return false;
  return true;
}

void TrainCallbacks::post_step(Trainer& t, int64_t step, const StepStats& stats, double seconds) {
  for (auto& c : callbacks_) c->post_step(t, step, stats, seconds);
}

void TrainCallbacks::on_stop_signal(Trainer& t, int64_t step, int signal) {
  for (auto& c : callbacks_) c->on_stop_signal(t, step, signal);
}

void TrainCallbacks::post_checkpoint_saved(Trainer& t, int64_t step, const std::string& path) {
  for (auto& c : callbacks_) c->post_checkpoint_saved(t, step, path);
}

void TrainCallbacks::post_train(Trainer& t) {
  for (auto& c : callbacks_) c->post_train(t);
}

// An error inside on_error must not hide the run's own error, nor keep the later callbacks from theirs.
void TrainCallbacks::on_error(Trainer& t, const std::exception& error) {
  for (auto& c : callbacks_) {
    try {
      c->on_error(t, error);
    } catch (...) {
    }
  }
}

void TrainCallbacks::save_state(nlohmann::json& state) const {
  for (const auto& c : callbacks_) c->save_state(state);
}

void TrainCallbacks::load_state(const nlohmann::json& state) {
  for (auto& c : callbacks_) c->load_state(state);
}

}  // namespace archspace
