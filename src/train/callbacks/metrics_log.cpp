// RUN/metrics.jsonl (rank 0, train/metrics_log.h) and the trackers of [log] (train/trackers.h): opened when the
// run starts, one line per step, closed (the trackers' plots) when it ends.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "archspace/train/callbacks/callbacks.h"
#include "archspace/train/trainer.h"

namespace archspace {

namespace {

using nlohmann::json;

class MetricsLogCallback final : public TrainCallback {
 public:
  std::string name() const override { return "metrics_log"; }

  void on_start(Trainer& t) override {
    if (t.rank() == 0) {
      const auto warn = [&t](const std::string& m) {
        t.progress().finish();
        std::fprintf(stderr, "warning: %s\n", m.c_str());
      };
      std::vector<std::unique_ptr<Tracker>> trackers;  // none for a run that is already finished
      if (t.start_step() < t.config().max_steps) trackers = make_trackers(t.config().log, t.tracking_context(), warn);
      t.set_metrics(std::make_unique<MetricsLog>((std::filesystem::path(t.config().run_dir) / "metrics.jsonl").string(),
                                                 t.start_step(), std::move(trackers), warn));
    }
    started_ = std::chrono::steady_clock::now();
  }

  void post_step(Trainer& t, int64_t step, const StepStats& s, double step_seconds) override {
    MetricsLog* metrics = t.metrics();
    if (!metrics) return;  // rank 0 logs for all
    const double step_tokens = static_cast<double>(t.global_batch() * t.config().sequence_length);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    json line = {{"step", step + 1},
                 {"tokens", t.tokens_seen()},
                 {"loss", s.loss},
                 {"z_loss", s.z_loss},
                 {"lr", s.lr},
                 {"grad_norm", s.grad_norm},
                 {"tokens_per_s", step_tokens / step_seconds},
                 {"elapsed_s", elapsed},
                 {"batch_hash", s.batch_hash}};
    if (!s.source_counts.empty()) {  // a mixture: the tokens of each source in this step's global batch
      json tokens = json::object();
      for (const auto& [name, instances] : s.source_counts) tokens[name] = instances * t.config().sequence_length;
      line["source_tokens"] = tokens;
    }
    metrics->write(line);
    if (s.spike_baseline) metrics->write(spike_line(t, step, s));
    if (s.skipped) metrics->write({{"step", step + 1}, {"skipped", true}});
    // No "loss" key in these lines: readers take the lines with "loss" as the step lines.
    if (!s.layer_grad_norms.is_null()) metrics->write({{"step", step + 1}, {"grad_norms", s.layer_grad_norms}});
  }

  // The trackers' plots and closing (a failure there is a warning).
  void post_train(Trainer& t) override {
    if (t.metrics()) t.metrics()->finish();
  }

 private:
  std::chrono::steady_clock::time_point started_;
};

}  // namespace

nlohmann::json spike_line(const Trainer& t, int64_t step, const StepStats& s) {
  return {{"step", step + 1},
          {"spike", true},
          {"spike_loss", s.loss},
          {"spike_baseline", *s.spike_baseline},
          {"spike_policy", t.config().spike_policy}};
}

std::unique_ptr<TrainCallback> make_metrics_log_callback(const Trainer&) {
  return std::make_unique<MetricsLogCallback>();
}

}  // namespace archspace
