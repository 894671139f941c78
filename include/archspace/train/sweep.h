// A sweep: one run config trained over a grid of overrides (e.g. topology x learning rate x warm-up), every
// point with the same data order and seed, each in its own run directory under the sweep directory, so a
// matched comparison is one command. Every point is resumable: a rerun skips finished points, resumes
// interrupted ones from their latest checkpoint, and (unless asked to retry) leaves diverged ones as they are.
// The summary (sweep.json) gives per point the final loss, whether it diverged, and its loss spikes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace archspace {

// One axis of the grid: "optim.lr=1e-3,3e-3" -> {"optim.lr", {"1e-3", "3e-3"}}.
struct SweepAxis {
  std::string key;
  std::vector<std::string> values;
};
// Throws naming the text when it is not KEY=V1[,V2...] with a section.key and no empty value.
SweepAxis parse_sweep_axis(const std::string& text);

struct SweepPoint {
  std::vector<std::pair<std::string, std::string>> settings;  // key, value: one per axis, in axis order
  std::string name;  // the run directory's name, e.g. "lr=0.001,warmup_steps=10"
};
// The cartesian product, the first axis varying slowest. Throws when an axis repeats a key.
std::vector<SweepPoint> expand_sweep_grid(const std::vector<SweepAxis>& axes);

// A loss spike: a finite step loss above `ratio` times the median of the previous `window` finite losses
// (the rule is relative, so it reads the same at loss 10 and at loss 3; the first `window` steps are never
// spikes). Returns the indices of the spiking steps.
struct LossSpikeRule {
  int64_t window = 20;
  double ratio = 1.2;
};
std::vector<int64_t> loss_spikes(const std::vector<double>& losses, const LossSpikeRule& rule = {});

// One point's outcome, read from its run directory: metrics.jsonl, checkpoints/final, and sweep_point.json
// (what the sweep recorded when the point's training ended: status and error).
struct SweepRunSummary {
  std::string name, run_dir;
  std::vector<std::pair<std::string, std::string>> settings;
  std::string status;   // finished | diverged | interrupted | failed | pending (not yet run, or a dry run)
  std::string message;  // the error of a diverged or failed run
  int64_t steps = 0;    // training steps logged
  double first_loss = 0, final_loss = 0, min_loss = 0;  // final: mean of the last min(10, steps) step losses
  double final_valid_loss = -1;                         // the last validation loss, -1 without validation
  std::vector<int64_t> spike_steps;                     // steps (1-based) the spike rule flags
  // Diverged: the loss became non-finite (training stops there: status "diverged"), or the run finished no lower
  // than it began.
  bool diverged = false;
};
SweepRunSummary summarize_sweep_run(const std::string& run_dir, const LossSpikeRule& rule);

struct SweepOptions {
  std::string config;                  // the run's TOML
  std::vector<std::string> overrides;  // --set, applied to every point before its grid values
  std::vector<SweepAxis> axes;
  std::string out_dir;  // the sweep directory ("" : the config's train.run_dir); point runs go in out_dir/NAME
  bool retry_diverged = false;
  bool dry_run = false;  // check every point's config, run nothing
  LossSpikeRule spikes;
};

// Runs (or resumes) every point in grid order and writes OUT_DIR/sweep.json. Every point's configuration is
// checked before the first one trains, so a typo fails at once. A signal (SIGINT/SIGTERM) stops the sweep after
// the running point's checkpoint: `interrupted` is then true and a rerun continues. on_point(i, n, summary) after
// each point.
struct SweepResult {
  std::string out_dir;
  std::vector<SweepRunSummary> runs;
  int stopped_by_signal = 0;
};
SweepResult run_sweep(const SweepOptions& options,
                      const std::function<void(size_t, size_t, const SweepRunSummary&)>& on_point = nullptr);

}  // namespace archspace
