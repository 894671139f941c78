// The training loop of one pipeline stage, read top to bottom in Trainer::run(): set up (device, model,
// data, optimizer), resume, then per step: the global batch in micro-batches (bf16 autocast on CUDA),
// clipping, the AdamW step, one metrics line and one progress line, evaluation, checkpoints.
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
#include "archspace/eval/downstream.h"
#include "archspace/io/run_dir.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/loss.h"
#include "archspace/train/batches.h"
#include "archspace/train/context_parallelism.h"
#include "archspace/train/embedding_gradient.h"
#include "archspace/train/fully_sharded.h"
#include "archspace/train/metrics_log.h"
#include "archspace/train/optimizer.h"
#include "archspace/train/stability.h"
#include "archspace/train/token_data.h"
#include "archspace/train/weight_casts.h"
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
  // Setup: device, run directory, model, data, optimizer. Throws naming the config file and key.
  Trainer(const TrainConfig& config, const TrainOptions& options);
  ~Trainer();

  TrainResult run();

 private:
  int stop_signal_received(int64_t step);
  std::unique_ptr<ProgressLine> make_progress() const;
  TrackingContext tracking_context() const;
  void setup_device();
  void setup_dist();
  void setup_run_dir();
  void setup_data();
  void setup_downstream();
  void setup_optimizer();
  void resume();
  void sync_ranks();
  void setup_full_sharding();
  void broadcast_updates();
  NamedTensors optimizer_state();
  void zero_gradients();
  // Instances per step: each data-parallel rank's (a context-parallel group shares its instances).
  int64_t global_batch() const { return cfg_.global_batch() * data_parallel_size(); }
  int64_t data_parallel_size() const { return cp_ ? cp_->data_parallel_size() : world_; }
  int64_t data_parallel_rank() const { return cp_ ? cp_->data_parallel_rank() : rank_; }
  // The step's micro-batches for this rank: the instances of its data-parallel rank, each sequence cut to its
  // context-parallel slice. `ids`: the whole sequences' input ids (for the batch hash).
  std::vector<Batch> assemble_micro_batches(int64_t step, std::vector<at::Tensor>& ids) const;
  // The forward's options for training (and validation, without checkpointing).
  SequenceOptions forward_options(bool training) const;

  StepStats train_step(int64_t step);
  void dump_gradients(int64_t step) const;
  double evaluate(const Instances& instances);
  void evaluate_validation(int64_t step);
  void evaluate_downstream(int64_t step);
  void save(int64_t step, bool is_final);
  void log_step(int64_t step, const StepStats& stats, double step_seconds);
  void log_spike(int64_t step, const StepStats& stats);
  void show_progress(int64_t step, const StepStats& stats, double step_seconds);

  TrainConfig cfg_;
  TrainOptions options_;
  at::Device device_ = at::kCPU;
  bool autocast_ = false;
  std::string resume_from_;  // the checkpoint to resume, or ""

  DistEnv dist_env_;  // world_size 1: one process, no communication
  int rank_ = 0, world_ = 1;
  std::unique_ptr<DistGroup> dist_;
  std::unique_ptr<RunDirLock> run_lock_;  // rank 0 holds the run directory while it trains
  std::unique_ptr<GradientReducer> reducer_;
  std::vector<int> owner_;  // ZeRO-1: the rank that updates each parameter; empty when not sharded
  // FSDP (train.sharding = "full"): the ranks sharing the parameters, under HSDP also the ranks holding the
  // same shard (null without train.replicate_groups); the sharded model the forward reads its weights from.
  std::unique_ptr<DistGroup> shard_group_, replicate_group_;
  std::unique_ptr<FullyShardedModel> fsdp_;
  std::unique_ptr<ContextParallelism> cp_;         // train.context_parallel > 1
  std::unique_ptr<StepWeightCasts> weight_casts_;  // bf16 without FSDP: the matmul weights cast once per step
  // One process on the CPU: the embedding's gradient, kept across steps and zeroed row by row
  // (train/embedding_gradient.h), and its index in params_; null and -1: a dense gradient per step.
  std::unique_ptr<EmbeddingGradient> embedding_grad_;
  int64_t embedding_param_ = -1;

  std::unique_ptr<CausalLM> model_;
  std::unique_ptr<BatchSource> train_batches_;
  std::vector<ValidationSet> valid_;      // data.valid, then [[eval.sources]]
  nlohmann::json mixture_fingerprint_;    // [[data.sources]]: checked against the checkpoint's on resume
  nlohmann::json mixture_record_;         // [[data.sources]]: RUN/data_mixture.json
  std::string tokenizer_file_;            // carried by checkpoints; "" for none
  int64_t document_eos_ = -1;             // train.document_masking: the data's EOS id (SequenceOptions); -1: off
  std::vector<PreparedTask> downstream_;  // eval.downstream, tokenized
  std::vector<AdamW::Group> params_;
  std::unique_ptr<AdamW> optimizer_;

  int64_t start_step_ = 0;
  uint64_t tokens_seen_ = 0;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<ProgressLine> progress_;
  std::chrono::steady_clock::time_point started_;
  std::string last_checkpoint_;
  SpikeDetector spikes_{0, 1};
};

// The CLI's entry point: Trainer(config, options).run().
TrainResult run_training(const TrainConfig& config, const TrainOptions& options);

}  // namespace archspace
