// eval.downstream: the downstream tasks (multiple choice and generation, eval/downstream_pipeline.h), read and
// tokenized once at setup (a bad task name fails before the first step), scored at each evaluation step into one
// metrics.jsonl line {"step", "tokens", "downstream": {task: {"metric" (the task's primary), "value", "stderr", "n",
// "format", "shots"}}} and one note. Every rank scores (no collective inside, so none waits on another); rank 0
// logs. Scoring draws no random numbers from the run's generators, so a resumed run stays exact.
#include <cmath>
#include <cstdio>

#include "archspace/eval/downstream_pipeline.h"
#include "archspace/eval/external_scorers.h"
#include "archspace/tokenizer/tokenizer.h"
#include "archspace/train/callbacks/callbacks.h"
#include "archspace/train/trainer.h"
#include "archspace/util/error.h"
#include "archspace/util/strings.h"

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
    // Multiple-choice and generation tasks (and groups) through the library's pipeline, as `eval downstream` runs
    // them.
    DownstreamSelection selection;
    selection.tasks = cfg.downstream;
    selection.format = cfg.downstream_format;
    selection.shots = cfg.downstream_shots;
    selection.limit = cfg.downstream_limit;
    try {
      pipeline_ = std::make_unique<DownstreamPipeline>(selection, plan_downstream(selection), nullptr);
    } catch (const Error& e) {
      throw Error(key + ": " + e.what());
    }
    // Minerva MATH and IFEval are scored by lm-eval's Python, as `eval downstream` scores them: checked here with
    // one known pair each, so that a missing package fails before the first step, not at the first evaluation (the
    // code tasks' sandbox is checked by the pipeline itself).
    if (const auto needing = pipeline_->tasks_needing_external_scorers(); !needing.empty()) {
      try {
        check_python_scorers();
      } catch (const Error& e) {
        throw Error(key + ": " + join(needing) + " need lm-eval's Python scorers, which cannot run here: " + e.what());
      }
    }
    pipeline_->prepare(*tokenizer, t.model().config(), cfg.sequence_length);
    tokenizer_ = tokenizer;
  }

  std::string name() const override { return "downstream_evaluation"; }

  void post_step(Trainer& t, int64_t step, const StepStats&, double) override {
    if (!evaluation_step(t, step)) return;
    // FSDP: scoring runs the whole model through infer/, so every rank gathers a whole copy for it (the
    // memory of one unsharded model, for the evaluation only).
    const std::unique_ptr<CausalLM> whole = t.strategy().whole_model(t.model(), t.device());
    // The generation tasks decode within the model's whole context (as `eval downstream` does by default).
    DownstreamOptions options;
    options.scorers = project_scorers([&t](const std::string& text) { t.progress().note(text); });
    const DownstreamResult scored = pipeline_->run(whole ? *whole : t.model(), tokenizer_, options);
    std::vector<TaskResult> results = scored.choice_results;
    results.insert(results.end(), scored.generation.results.begin(), scored.generation.results.end());
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
  std::unique_ptr<DownstreamPipeline> pipeline_;  // eval.downstream, read and tokenized
  std::shared_ptr<const Tokenizer> tokenizer_;    // its generation tasks decode with it
};

}  // namespace

std::unique_ptr<TrainCallback> make_downstream_evaluation_callback(const Trainer& trainer) {
  if (trainer.config().downstream.empty()) return nullptr;
  return std::make_unique<DownstreamEvaluationCallback>(trainer);
}

}  // namespace archspace
