// How one training step computes and applies its gradients, one implementation per parallel mode, chosen once
// at setup (make_gradient_strategy) so that Trainer::train_step reads the same in every mode:
//   single process   (train/single_process_strategy.cpp): local gradients; on the CPU the embedding's gradient
//                    kept across steps and zeroed row by row (train/embedding_gradient.h)
//   data-parallel    (train/data_parallel_strategy.cpp): torchrun, every rank holds the whole model; the
//                    gradients are all-reduced during the last micro-batch's backward; with train.sharding =
//                    "optimizer" (ZeRO-1) each rank updates its share and broadcasts it
//   fully sharded    (train/fully_sharded_strategy.cpp): train.sharding = "full", FSDP/HSDP through
//                    train/fully_sharded.h
// Context parallelism (train/context_parallelism.h) composes with the distributed modes: it cuts the batch and
// runs inside the forward, and the strategy folds its slices when it gathers the batch.
// A new parallel mode is one more implementation of GradientStrategy and one more case in
// parallel_mode()/make_gradient_strategy().
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "archspace/config/train_config.h"
#include "archspace/dist/process_group.h"
#include "archspace/io/safetensors.h"
#include "archspace/model/causal_lm.h"
#include "archspace/train/batches.h"
#include "archspace/train/context_parallelism.h"
#include "archspace/train/fully_sharded.h"
#include "archspace/train/optimizer.h"
#include "archspace/util/progress.h"

namespace archspace {

enum class ParallelMode { kSingleProcess, kDataParallel, kFullySharded };
const char* parallel_mode_name(ParallelMode mode);

// The mode a run takes: one process, or under torchrun (`world_size` > 1) train.sharding = "full" or not.
ParallelMode parallel_mode(const TrainConfig& cfg, int world_size);

class GradientStrategy {
 public:
  virtual ~GradientStrategy() = default;

  AdamW& optimizer() { return *optimizer_; }
  const AdamW& optimizer() const { return *optimizer_; }
  const std::vector<AdamW::Group>& groups() const { return groups_; }

  // ---- collectives of the step over the data-parallel ranks (identity in one process) ----
  // Sums `t` over every rank (the global batch's labelled tokens, its losses).
  virtual void sum_over_ranks(at::Tensor& t, const std::string& what) = 0;
  // The input ids of the whole global batch, in data-parallel order, from this rank's `ids`.
  virtual at::Tensor global_batch_ids(const at::Tensor& ids, const std::string& what) = 0;

  // ---- the step ----
  // Before the first micro-batch's forward.
  virtual void begin_step(int64_t step, const std::vector<Batch>& micro) = 0;
  // What the forward reads its weights from (null: the model's own), and whether the embedding's gradient is sparse.
  virtual ParameterSource* parameter_source(bool training) const = 0;
  virtual bool sparse_embedding_gradient(bool training) const = 0;
  // The LM head's weight for the loss, read after the forward; and its bf16 cast of the step (or undefined).
  virtual at::Tensor head_weight() = 0;
  virtual at::Tensor head_weight_cast() = 0;
  // The backward of micro-batch `loss` (normalised by the global batch's labelled tokens); `last`: the step's
  // last micro-batch, whose backward completes the gradients of the whole global batch.
  virtual void backward(at::Tensor loss, int64_t step, bool last) = 0;
  // After the step's backwards: the graph's handles on the step's casts are dropped (also called at the end of
  // the step, when it throws included; a second call does nothing).
  virtual void end_backward() = 0;
  // Per-layer gradient norms before clipping (stability.h), or null on ranks that do not report them.
  virtual nlohmann::json layer_grad_norms(int64_t num_layers) = 0;
  // The whole gradients, for train.dump_gradients_steps: collective where gradients are sharded; nullopt on the
  // ranks that do not write them.
  virtual std::optional<NamedTensors> gradients_to_dump() = 0;
  // Clips the gradients to `max_norm` and returns their norm before clipping (now or inside the optimizer step).
  virtual double clip_gradients(double max_norm) = 0;
  // The optimizer's step with the clipped gradients, then every rank holds the new weights.
  virtual void optimizer_step(double lr, double weight_decay) = 0;
  virtual void zero_gradients() = 0;

  // ---- outside the step ----
  // After the forward of an evaluation batch (FSDP frees the weights it gathered).
  virtual void release_after_forward() = 0;
  // The model with whole weights on `device` for checkpoints and downstream evaluation: null when `model` holds
  // them already. Collective where sharded.
  virtual std::unique_ptr<CausalLM> whole_model(const CausalLM& model, at::Device device) = 0;
  // The whole optimizer state, whatever the sharding (every rank takes part; rank 0's is complete).
  virtual NamedTensors optimizer_state() = 0;
  // Loads a checkpoint's whole parameters (parameter_specs order) and optimizer state.
  virtual void load(const NamedTensors& parameters, const NamedTensors& optimizer_state, int64_t steps_taken,
                    const std::string& source) = 0;
  // Every rank takes rank 0's parameters (a no-op where they were cut from rank 0's already).
  virtual void broadcast_parameters() = 0;
  // What the checkpoint records of the mode.
  virtual bool shards_optimizer() const { return false; }
  virtual int64_t replicate_groups() const { return 1; }

 protected:
  std::vector<AdamW::Group> groups_;
  std::unique_ptr<AdamW> optimizer_;
};

// What a strategy is set up from. `dist`: null in one process; `cp`: null without context parallelism;
// `layout`: FSDP's (train.replicate_groups), checked before the ranks joined.
struct StrategySetup {
  const TrainConfig& cfg;
  CausalLM& model;
  at::Device device;
  DistGroup* dist = nullptr;
  ContextParallelism* cp = nullptr;
  std::optional<ShardLayout> layout;
  ProgressLine& progress;  // notes of the setup
};

std::unique_ptr<GradientStrategy> make_gradient_strategy(ParallelMode mode, const StrategySetup& setup);

}  // namespace archspace
