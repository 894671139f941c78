// The training loop of one pipeline stage, read top to bottom in Trainer::run(): set up (device, model,
// data, callbacks, the parallel mode's gradient strategy), resume, then per step: the global batch in
// micro-batches (bf16 autocast on CUDA), clipping, the AdamW step (Trainer::train_step, through the
// GradientStrategy of train/gradient_strategy.h), and the callbacks of train/callback.h around it: one metrics
// line and one progress line, evaluation, checkpoints.
// Data-parallel under torchrun (WORLD_SIZE > 1): rank r computes its slice of each global batch, gradients
// are all-reduced during the last micro-batch's backward, every rank takes the same optimizer step, and
// rank 0 alone writes metrics, progress and checkpoints (which do not depend on the number of ranks).
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "archspace/config/train_config.h"
#include "archspace/dist/process_group.h"
#include "archspace/io/run_dir.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/loss.h"
#include "archspace/train/batches.h"
#include "archspace/train/callback.h"
#include "archspace/train/context_parallelism.h"
#include "archspace/train/gradient_strategy.h"
#include "archspace/train/metrics_log.h"
#include "archspace/train/token_data.h"
#include "archspace/train/trackers.h"
#include "archspace/util/progress.h"

namespace archspace {

struct TrainOptions {
  bool resume = false;
  std::string resume_from;  // "step-N" or a checkpoint path: resume from it rather than the newest
  bool progress = true;
  int64_t stop_after_step = 0;  // >0: stop after this step as if interrupted (tests of resume)
};

struct TrainResult {
  std::vector<double> losses;  // per step run in this call
  std::string final_checkpoint;
  int stopped_by_signal = 0;  // SIGTERM/SIGINT: a checkpoint of the last whole step was written, then it stopped
};

// What one optimizer step measured.
struct StepStats {
  double loss = 0, z_loss = 0;  // per labelled token
  double lr = 0, grad_norm = 0;
  std::string batch_hash;
  bool skipped = false;  // not finite, and train.nonfinite = "skip"; or a spike under train.spike = "skip": no update
  std::optional<double> spike_baseline;  // a loss spike: the mean of the recent losses it exceeded
  nlohmann::json layer_grad_norms;       // null, or per-layer gradient norms (train.grad_norm_interval)
  std::vector<std::pair<std::string, int64_t>> source_counts;  // a mixture's instances of each source this step
};

class Trainer {
 public:
  // Setup: device, run directory, model, data, callbacks, the parallel mode's gradient strategy. Throws naming
  // the config file and key.
  Trainer(const TrainConfig& config, const TrainOptions& options);
  ~Trainer();

  TrainResult run();

  // ---- what callbacks read and do (train/callback.h) ----
  const TrainConfig& config() const { return cfg_; }
  const TrainOptions& options() const { return options_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  at::Device device() const { return device_; }
  int64_t start_step() const { return start_step_; }
  uint64_t tokens_seen() const { return tokens_seen_; }
  // Instances per step: each data-parallel rank's (a context-parallel group shares its instances).
  int64_t global_batch() const { return cfg_.global_batch() * data_parallel_size(); }
  const CausalLM& model() const { return *model_; }
  GradientStrategy& strategy() { return *strategy_; }
  const std::string& tokenizer_file() const { return tokenizer_file_; }
  const std::vector<ValidationSet>& validation_sets() const { return valid_; }
  ProgressLine& progress() { return *progress_; }
  // The run's metrics.jsonl, on rank 0 once the metrics callback opened it; null elsewhere.
  MetricsLog* metrics() { return metrics_.get(); }
  void set_metrics(std::unique_ptr<MetricsLog> metrics) { metrics_ = std::move(metrics); }
  // What the trackers show beside the config file: facts the engine derived from it.
  TrackingContext tracking_context() const;
  // Mean validation loss per labelled token over the first eval.batches batches (no z-loss). Every rank.
  double validation_loss(const Instances& instances);
  // Writes the checkpoint of `step` (the number of steps done): collective, rank 0 writes. Then the callbacks'
  // post_checkpoint_saved.
  void save_checkpoint(int64_t step, bool is_final);
  const TrainCallbacks& callbacks() const { return callbacks_; }
  // One more callback after the config's (train/callbacks/callbacks.h registers those): tests, tools.
  void add_callback(std::unique_ptr<TrainCallback> callback) { callbacks_.add(std::move(callback)); }

 private:
  int stop_signal_received(int64_t step);
  std::unique_ptr<ProgressLine> make_progress() const;
  void setup_device();
  void setup_dist();
  void setup_run_dir();
  void setup_data();
  void setup_strategy();
  void resume();
  void check_recipe(const nlohmann::json& state) const;  // the checkpoint's optim.recipe is the config's
  void sync_ranks();
  void complete_final_save();  // a run resumed at its last step: `final`, `latest` and pruning as a save ends them
  int64_t data_parallel_size() const { return cp_ ? cp_->data_parallel_size() : world_; }
  int64_t data_parallel_rank() const { return cp_ ? cp_->data_parallel_rank() : rank_; }
  // The step's micro-batches for this rank: the instances of its data-parallel rank, each sequence cut to its
  // context-parallel slice. `ids`: the whole sequences' input ids (for the batch hash).
  std::vector<Batch> assemble_micro_batches(int64_t step, std::vector<at::Tensor>& ids) const;
  // The forward's options for training (and validation, without checkpointing).
  SequenceOptions forward_options(bool training) const;

  // The step, in the order train_step runs them.
  StepStats train_step(int64_t step);
  int64_t global_labelled_tokens(int64_t step, const std::vector<Batch>& micro);
  std::pair<double, double> forward_backward(int64_t step, const std::vector<Batch>& micro, int64_t labelled);
  void record_batch(int64_t step, double ce, double z, int64_t labelled, const std::vector<at::Tensor>& ids,
                    StepStats& stats);

  TrainConfig cfg_;
  TrainOptions options_;
  at::Device device_ = at::kCPU;
  bool autocast_ = false;
  std::string resume_from_;  // the checkpoint to resume, or ""

  DistEnv dist_env_;  // world_size 1: one process, no communication
  int rank_ = 0, world_ = 1;
  std::unique_ptr<DistGroup> dist_;
  std::unique_ptr<RunDirLock> run_lock_;     // rank 0 holds the run directory while it trains
  std::optional<ShardLayout> shard_layout_;  // train.sharding = "full": checked before the ranks joined
  std::unique_ptr<ContextParallelism> cp_;   // train.context_parallel > 1

  std::unique_ptr<CausalLM> model_;
  std::unique_ptr<BatchSource> train_batches_;
  std::vector<ValidationSet> valid_;    // data.valid, then [[eval.sources]]
  nlohmann::json mixture_fingerprint_;  // [[data.sources]]: checked against the checkpoint's on resume
  nlohmann::json mixture_record_;       // [[data.sources]]: RUN/data_mixture.json
  std::string tokenizer_file_;          // carried by checkpoints; "" for none
  int64_t document_eos_ = -1;           // train.document_masking: the data's EOS id (SequenceOptions); -1: off
  // How the step computes and applies its gradients in this run's parallel mode (chosen once, at setup).
  std::unique_ptr<GradientStrategy> strategy_;
  TrainCallbacks callbacks_;

  int64_t start_step_ = 0;
  uint64_t tokens_seen_ = 0;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<ProgressLine> progress_;
  std::string last_checkpoint_;
};

// The CLI's entry point: Trainer(config, options).run().
TrainResult run_training(const TrainConfig& config, const TrainOptions& options);

}  // namespace archspace
