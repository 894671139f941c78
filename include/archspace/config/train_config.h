// TrainConfig: one training run (one pipeline stage), read from TOML. One key per concept; an unknown
// key is an error. Every key is documented in docs/training.md ("Training configuration").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "archspace/config/choices.h"
#include "archspace/config/model_config.h"
#include "archspace/config/recipe.h"

namespace archspace {

// train.loss_chunk_tokens' default: 1,024 x 100,278 fp32 logits are 392 MiB, and a [1024, d] x [d, V] matmul
// is still large enough to run at full speed on a GPU.
inline constexpr int64_t kDefaultLossChunkTokens = 1024;

// [log]: experiment trackers fed from the metrics record (docs/training.md, "Tracking").
struct WandbConfig {
  bool enabled = false;  // the table [log.wandb] (or log.wandb = {...}) is present
  std::string project = "archspace";
  std::string name;              // "" : the run directory's name
  std::string mode = "offline";  // offline | online | disabled
};
struct LogConfig {
  std::string tensorboard;  // a directory for TensorBoard event files; "" : none
  WandbConfig wandb;
};

// [[data.sources]]: one source of a weighted mixture (docs/data.md, "Mixtures").
struct DataSourceConfig {
  std::string name;
  std::vector<std::string> paths;  // `path` or `paths`: token sources read one after the other
  double ratio = 0;                // its share of the mixture's instances; the ratios sum to 1
  double max_repetition = 1;       // how many times over its data one epoch of the mixture may read it
};

// [[eval.sources]]: a validation set of its own, logged as valid/NAME/loss.
struct EvalSourceConfig {
  std::string name;
  std::string path;
};

struct TrainConfig {
  std::string source;  // the TOML file, for messages
  // The configuration as run, as TOML text: the file's own bytes, or (after --set overrides or a
  // {variant} placeholder) the resolved table. Checkpoints carry it as train_config.toml.
  std::string text;

  // [model]
  std::string preset;        // a preset name, or
  std::string model_config;  // a config.json path
  Variant variant = Variant::kBase;
  VariantSwitches switches;  // use_siamese_norm, use_depth_attention, depth_attention_stride/_recent_window
  std::string init_from;     // a checkpoint (or model directory) whose weights start this stage
  InitScheme init = InitScheme::kOlmoCore;  // without init_from: how the weights are drawn (model.init)
  std::optional<YarnScaling> rope_scaling;  // switch YaRN on for full layers
  std::optional<int64_t> max_position_embeddings;

  // [data]
  std::string train_data;  // token shard directory, or chat JSONL when format = chat
  std::string valid_data;  // optional
  // A mixture instead of train_data: its sources and its token budget per epoch (0: the run's tokens,
  // max_steps x global batch x sequence_length).
  std::vector<DataSourceConfig> sources;
  int64_t mix_tokens = 0;
  // Element type of OLMo-core .npy token files that carry no manifest ("uint8", "uint16", "uint32",
  // "uint64"); empty: the smallest that holds the model's vocabulary, as OLMo-core picks it.
  std::string token_dtype;
  DataFormat format = DataFormat::kTokens;
  std::string tokenizer = "dolma2";  // for chat data
  bool shuffle = true;
  // train.data_order: whose order token instances are read in (config/recipe.h; one data.train source).
  DataOrder data_order = DataOrder::kArchspace;

  // [train]
  std::string run_dir;
  int64_t sequence_length = 0;
  int64_t micro_batch = 1;
  int64_t grad_accum = 1;
  int64_t max_steps = 0;
  uint64_t seed = 0;
  DeviceSpec device;
  DType dtype = DType::kFp32;  // bf16: autocast (weights and optimizer stay fp32)
  // The block's linear layers' matmuls in FP8 (e4m3, tensorwise dynamic scaling; kernels/fp8_linear.h), the rest
  // as train.dtype = "bf16" has it, which it requires.
  bool fp8 = false;
  // The block's RMSNorms (Q/K norm with RoPE, the residual adds around the sublayers' norms) and its SwiGLU through
  // the fused training kernels (kernels/fused_training.h) instead of ATen's composite ops. Off by default until the
  // device check measures them faster on the GPU.
  bool fused_kernels = false;
  int threads = 0;
  // Keep only each block's inputs in forward and recompute the block in backward (model/activation_checkpoint.h).
  bool activation_checkpointing = false;
  // Intra-document masking: attention stays within the documents (each ending with the data's EOS) of each
  // packed instance (model/documents.h); token data only.
  bool document_masking = false;
  // A Kineto trace of steps [first, last] (1-based) per rank (train/step_profiler.h); empty: off.
  std::vector<int64_t> profile_steps;
  // The head and loss a chunk of this many labelled tokens at a time, when a micro-batch has more tokens
  // (model/loss.h head_loss): logits of one chunk instead of [micro_batch x sequence_length, vocab]. 0: unchunked.
  int64_t loss_chunk_tokens = kDefaultLossChunkTokens;
  // Data-parallel runs (docs/distributed.md): train.sharding = "none" | "optimizer" (ZeRO-1; the older key
  // train.shard_optimizer = true says the same) | "full" (FSDP). train.replicate_groups = R > 1 (HSDP, with
  // "full"): shard within groups of world / R consecutive ranks, all-reduce across the R groups.
  Sharding sharding = Sharding::kNone;
  int64_t replicate_groups = 1;
  // With "full" and grad_accum > 1: true (default) reduce-scatters every micro-batch's gradients as its backward
  // completes (sharded between micro-batches); false keeps each rank's unsharded fp32 gradients over the step's
  // micro-batches and reduces once, in the last backward (FSDP2's set_requires_gradient_sync(False)): a full
  // gradient's memory for a step's worth less communication, and at 2 ranks the sums "none" forms.
  bool reduce_each_micro_batch = true;
  // Context parallelism: each sequence split into this many contiguous slices, one per rank of a group of
  // consecutive ranks that read the same instances (train/context_parallelism.h); the data-parallel degree is
  // the world size / this. 1: off.
  int64_t context_parallel = 1;
  // A step whose loss or gradient norm is not finite: stop (error, nothing of it saved) or skip it (no
  // update, logged with "skipped": true).
  bool skip_nonfinite_steps = false;
  bool log_all_ranks = false;  // data-parallel runs: every rank prints its progress line (labelled), not rank 0 alone
                               // // train.nonfinite = "stop" (default) | "skip"
  // Stability traces (docs/training.md, "Stability"): per-layer gradient norms every N steps (0: off); loss spikes,
  // a loss above spike_factor x the median of the last spike_window losses (spike_factor 0: off), and what a
  // spike does: record it, skip the step (no update), or stop.
  int64_t grad_norm_interval = 0;
  double spike_factor = 0;
  int64_t spike_window = 20;
  std::string spike_policy = "record";  // train.spike
  int64_t dist_timeout_s = 300;         // data-parallel runs: how long any wait on other ranks (a collective, rank 0's
                                        // checkpoint write) may last before it fails

  // [optim]
  // optim.recipe: whose conventions the run follows (config/recipe.h); it sets the defaults of schedule_convention,
  // decay_norms, decay_embeddings and skip_steps below, which explicit keys override.
  Recipe recipe = Recipe::kOlmoCore;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;
  bool fused = true;        // one-pass AdamW (kernels/adamw.h on the CPU, LibTorch's on CUDA); false: the loop
  bool decay_norms = true;  // norms and SiameseNorm scale vectors (the 1-D parameters)
  bool decay_embeddings = false;
  // The learning-rate schedule (train/lr_schedule.h): its shape, and whose step counting and formulas compute it.
  ScheduleShape schedule = ScheduleShape::kCosine;
  ScheduleConvention schedule_convention = ScheduleConvention::kOlmoCore;
  int64_t warmup_steps = 0;
  double final_lr_factor = 0.1;
  std::optional<int64_t> decay_steps;  // WSD's decay phase; unset: round(0.1 x max_steps), OLMo-core's default
  WsdDecayShape wsd_decay_shape = WsdDecayShape::kLinear;
  // OLMo-core's SkipStepAdamW rule (train/skip_step.h): skip an update whose loss or gradient norm exceeds the mean
  // of the last skip_step_window steps by more than skip_step_sigma standard deviations, once half a window is seen.
  bool skip_steps = true;
  int64_t skip_step_window = 128;
  double skip_step_sigma = 6;
  double clip_grad_norm = 1.0;  // 0: off
  double z_loss = 1e-5;

  // [checkpoint]
  int64_t checkpoint_interval = 0;  // 0: only the final one
  int64_t keep_last = 3;

  // [eval]
  int64_t eval_interval = 0;
  int64_t eval_batches = 4;
  // Downstream tasks (OLMES names, eval/task_files.h) scored at every evaluation, their first downstream_limit
  // documents each (0: all), in downstream_format (rc or mc) with downstream_shots (unset: 5 where the task
  // has them, else its only count).
  std::vector<std::string> downstream;
  std::string downstream_format = "rc";
  std::optional<int64_t> downstream_shots;
  int64_t downstream_limit = 0;
  std::vector<EvalSourceConfig> eval_sources;

  // [log]
  LogConfig log;

  // [debug]
  int64_t dump_gradients_steps = 0;  // write the gradients of the first N steps (tests)

  // Per process; a data-parallel run's global batch is this times the number of ranks.
  int64_t global_batch() const { return micro_batch * grad_accum; }

  // Reads the TOML at `path`, applies `overrides` ("section.key=value", e.g. "train.max_steps=100" or
  // "model.variant=siamese_depth"; each checked against the key's type, unknown keys refused) to the
  // parsed table, substitutes "{variant}" in every string value by model.variant, then validates.
  // Throws archspace::Error naming the file (or the override) and the key.
  static TrainConfig load(const std::string& path, const std::vector<std::string>& overrides = {});

  // The model this run trains (before any init_from); throws naming the TOML key on bad values.
  ModelConfig model() const;
};

}  // namespace archspace
