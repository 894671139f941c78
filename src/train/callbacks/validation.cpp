// data.valid and [[eval.sources]]: at each evaluation step, one metrics.jsonl line with every validation set's
// loss, "valid_loss" (data.valid) and "valid/NAME/loss" ([[eval.sources]]), and one note. Every rank evaluates
// the same batches: no rank waits on another.
#include <cstdio>

#include "archspace/train/callbacks/callbacks.h"
#include "archspace/train/trainer.h"

namespace archspace {

namespace {

class ValidationCallback final : public TrainCallback {
 public:
  std::string name() const override { return "validation"; }

  void post_step(Trainer& t, int64_t step, const StepStats&, double) override {
    if (!evaluation_step(t, step)) return;
    nlohmann::json line = {{"step", step + 1}, {"tokens", t.tokens_seen()}};
    std::string text = "step " + std::to_string(step + 1) + " | validation loss";
    for (const ValidationSet& v : t.validation_sets()) {
      const double loss = t.validation_loss(*v.instances);
      line[v.metric] = loss;
      char value[128];
      if (v.metric == "valid_loss")
        std::snprintf(value, sizeof(value), " %.4f", loss);
      else  // valid/NAME/loss -> NAME
        std::snprintf(value, sizeof(value), " | %s %.4f", v.metric.substr(6, v.metric.size() - 11).c_str(), loss);
      text += value;
    }
    if (t.metrics()) t.metrics()->write(line);
    t.progress().note(text);
  }
};

}  // namespace

std::unique_ptr<TrainCallback> make_validation_callback(const Trainer& trainer) {
  if (trainer.validation_sets().empty()) return nullptr;
  return std::make_unique<ValidationCallback>();
}

}  // namespace archspace
