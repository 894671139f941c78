// The registry of the training callbacks: the list in callbacks.h, in the order of their side effects.
#include "archspace/train/callbacks/callbacks.h"

#include "archspace/train/trainer.h"

namespace archspace {

void register_callbacks(TrainCallbacks& callbacks, Trainer& trainer) {
  // Each factory of the list in callbacks.h, in its order; null: the config does not ask for that one.
  auto add = [&](std::unique_ptr<TrainCallback> callback) {
    if (callback) callbacks.add(std::move(callback));
  };
#define ARCHSPACE_ADD_TRAIN_CALLBACK(name) add(make_##name##_callback(trainer));
  ARCHSPACE_TRAIN_CALLBACKS(ARCHSPACE_ADD_TRAIN_CALLBACK)
#undef ARCHSPACE_ADD_TRAIN_CALLBACK
}

bool evaluation_step(const Trainer& trainer, int64_t step) {
  return every_interval(trainer.config().eval_interval, step + 1) || step + 1 == trainer.config().max_steps;
}

}  // namespace archspace
