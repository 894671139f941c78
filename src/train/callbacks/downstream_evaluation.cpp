// eval.downstream: the downstream tasks, read and tokenized once at setup (a bad task name fails before the first
// step), scored at each evaluation step into one metrics.jsonl line {"step", "tokens", "downstream": {task:
// {"metric" (the task's primary), "value", "stderr", "n", "format", "shots"}}} and one note. Every rank scores (no
// collective inside, so none waits on another); rank 0 logs. Scoring draws no random numbers, so a resumed run
// stays exact.
#include <cmath>
#include <cstdio>

#include "archspace/eval/downstream.h"
#include "archspace/eval/tasks.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/train/callbacks/callbacks.h"
#include "archspace/train/trainer.h"
#include "archspace/util/error.h"

namespace archspace {

namespace {

class DownstreamEvaluationCallback final : public TrainCallback {
 public:
  explicit DownstreamEvaluationCallback(const Trainer& t) {
    const TrainConfig& cfg = t.config();
    const std::string key = cfg.source + ": key 'eval.downstream'";
    if (t.tokenizer_file().empty()) {
      throw Error(key + " needs the run's tokenizer, and " +
                  (cfg.sources.empty() ? cfg.train_data : cfg.sources[0].paths[0] + " (the mixture's first source)") +
                  " carries none (tokenize the data with `archspace tokenize`, which stores it)");
    }
    const auto tokenizer = Tokenizer::load(t.tokenizer_file());
    std::vector<TaskVariant> variants;
    try {
      variants = select_task_variants(default_task_dirs(), cfg.downstream, cfg.downstream_format, cfg.downstream_shots);
    } catch (const Error& e) {
      throw Error(key + ": " + e.what());
    }
    for (const auto& v : variants) {
      tasks_.push_back(prepare_task(load_task(v.dir, v.task, v.format, v.shots, cfg.downstream_limit), *tokenizer,
                                    t.model().config(), cfg.sequence_length));
    }
  }

  std::string name() const override { return "downstream_evaluation"; }

  void post_step(Trainer& t, int64_t step, const StepStats&, double) override {
    if (!evaluation_step(t, step)) return;
    // FSDP: scoring runs the whole model through infer/, so every rank gathers a whole copy for it (the
    // memory of one unsharded model, for the evaluation only).
    const std::unique_ptr<CausalLM> whole = t.strategy().whole_model(t.model(), t.device());
    const std::vector<TaskResult> results = evaluate_tasks(whole ? *whole : t.model(), tasks_);
    nlohmann::json tasks = nlohmann::json::object();
    std::string line = "step " + std::to_string(step + 1) + " | downstream";
    for (const auto& r : results) {
      for (const auto& m : r.metrics) {
        if (!m.primary) continue;
        tasks[r.task] = {{"metric", m.name},
                         {"value", m.value},
                         {"stderr", std::isfinite(m.stderr_) ? nlohmann::json(m.stderr_) : nlohmann::json()},
                         {"n", r.documents},
                         {"format", r.format},
                         {"shots", r.shots}};
        char v[160];
        std::snprintf(v, sizeof(v), " %s %s %.4f", r.task.c_str(), m.name.c_str(), m.value);
        line += v;
      }
    }
    if (t.metrics()) t.metrics()->write({{"step", step + 1}, {"tokens", t.tokens_seen()}, {"downstream", tasks}});
    t.progress().note(line);
  }

 private:
  std::vector<PreparedTask> tasks_;  // eval.downstream, tokenized
};

}  // namespace

std::unique_ptr<TrainCallback> make_downstream_evaluation_callback(const Trainer& trainer) {
  return std::make_unique<DownstreamEvaluationCallback>(trainer);
}

}  // namespace archspace
