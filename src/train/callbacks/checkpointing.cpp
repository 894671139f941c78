// Checkpoints every train.checkpoint_interval steps, after the last one (the final checkpoint), and when a signal
// stops the run (unless this step's checkpoint was just written); the writing itself is Trainer::save_checkpoint
// (train/checkpoint.h).
#include "archspace/train/callbacks/callbacks.h"
#include "archspace/train/trainer.h"

namespace archspace {

namespace {

class CheckpointingCallback final : public TrainCallback {
 public:
  std::string name() const override { return "checkpointing"; }

  void post_step(Trainer& t, int64_t step, const StepStats&, double) override {
    const bool last = step + 1 == t.config().max_steps;
    if (last || every_interval(t.config().checkpoint_interval, step + 1)) save(t, step + 1, last);
  }

  void on_stop_signal(Trainer& t, int64_t step, int) override {
    if (saved_step_ != step + 1) save(t, step + 1, false);
  }

 private:
  void save(Trainer& t, int64_t steps, bool is_final) {
    t.save_checkpoint(steps, is_final);
    saved_step_ = steps;
  }

  int64_t saved_step_ = -1;  // the steps the last checkpoint written here holds
};

}  // namespace

std::unique_ptr<TrainCallback> make_checkpointing_callback(const Trainer&) {
  return std::make_unique<CheckpointingCallback>();
}

}  // namespace archspace
