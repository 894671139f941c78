// train.dump_gradients_steps = N (tests): the whole gradients of the first N steps, before clipping, in
// RUN/debug/grads-step-NNNNNN.safetensors. Sharded gradients are gathered by every rank; rank 0 writes.
#include <cstdio>
#include <filesystem>

#include "archspace/train/callbacks/callbacks.h"
#include "archspace/train/trainer.h"

namespace archspace {

namespace {

class GradientDumpCallback final : public TrainCallback {
 public:
  std::string name() const override { return "gradient_dump"; }

  void post_backward(Trainer& t, int64_t step) override {
    if (step >= t.config().dump_gradients_steps) return;
    const std::optional<NamedTensors> grads = t.strategy().gradients_to_dump();
    if (!grads) return;
    const std::filesystem::path dir = std::filesystem::path(t.config().run_dir) / "debug";
    std::filesystem::create_directories(dir);
    char name[64];
    std::snprintf(name, sizeof(name), "grads-step-%06lld.safetensors", static_cast<long long>(step + 1));
    save_safetensors((dir / name).string(), *grads);
  }
};

}  // namespace

std::unique_ptr<TrainCallback> make_gradient_dump_callback(const Trainer& trainer) {
  if (trainer.config().dump_gradients_steps <= 0) return nullptr;
  return std::make_unique<GradientDumpCallback>();
}

}  // namespace archspace
