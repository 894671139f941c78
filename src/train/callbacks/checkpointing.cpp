// Checkpoints every train.checkpoint_interval steps and after the last one (the final checkpoint); the writing
// itself is Trainer::save_checkpoint (train/checkpoint.h), which a stop signal also calls.
#include "archspace/train/callbacks/callbacks.h"
#include "archspace/train/trainer.h"

namespace archspace {

namespace {

class CheckpointingCallback final : public TrainCallback {
 public:
  std::string name() const override { return "checkpointing"; }

  void post_step(Trainer& t, int64_t step, const StepStats&, double) override {
    const bool last = step + 1 == t.config().max_steps;
    if (last || every_interval(t.config().checkpoint_interval, step + 1)) t.save_checkpoint(step + 1, last);
  }
};

}  // namespace

std::unique_ptr<TrainCallback> make_checkpointing_callback(const Trainer&) {
  return std::make_unique<CheckpointingCallback>();
}

}  // namespace archspace
