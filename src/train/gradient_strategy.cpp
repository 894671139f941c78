#include "archspace/train/gradient_strategy.h"

#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include "archspace/train/replicated_strategy.h"
#include "archspace/train/stability.h"

namespace archspace {

const char* parallel_mode_name(ParallelMode mode) {
  switch (mode) {
    case ParallelMode::kSingleProcess:
      return "single process";
    case ParallelMode::kDataParallel:
      return "data-parallel";
    case ParallelMode::kFullySharded:
      return "fully sharded";
  }
  return "?";
}

ParallelMode parallel_mode(const TrainConfig& cfg, int world_size) {
  if (world_size <= 1) return ParallelMode::kSingleProcess;
  return cfg.sharding == Sharding::kFull ? ParallelMode::kFullySharded : ParallelMode::kDataParallel;
}

std::unique_ptr<GradientStrategy> make_gradient_strategy(ParallelMode mode, const StrategySetup& setup) {
  switch (mode) {
    case ParallelMode::kSingleProcess:
      return make_single_process_strategy(setup);
    case ParallelMode::kDataParallel:
      return make_data_parallel_strategy(setup);
    case ParallelMode::kFullySharded:
      return make_fully_sharded_strategy(setup);
  }
  return nullptr;
}

at::Tensor gather_global_batch(DistGroup& dist, ContextParallelism* cp, const at::Tensor& ids,
                               const std::string& what) {
  at::Tensor all = dist.all_gather(ids, what);
  if (cp)
    all = all.view({cp->data_parallel_size(), cp->degree(), -1, all.size(1)}).select(1, 0).reshape({-1, all.size(1)});
  return all;
}

// ---- ReplicatedStrategy ---------------------------------------------------------------------------

ReplicatedStrategy::ReplicatedStrategy(const StrategySetup& setup) : model_(setup.model), device_(setup.device) {
  const TrainConfig& cfg = setup.cfg;
  const auto specs = parameter_specs(model_.config());
  for (size_t i = 0; i < specs.size(); ++i) {
    at::Tensor p = model_.parameters()[i].second;
    p.requires_grad_(true);
    const bool decay = specs[i].kind == ParamKind::kLinear ||
                       (specs[i].kind == ParamKind::kEmbedding && cfg.decay_embeddings) ||
                       (specs[i].kind == ParamKind::kNorm && cfg.decay_norms);
    groups_.push_back({specs[i].name, p, decay});
  }
  optimizer_ = std::make_unique<AdamW>(
      groups_, AdamWOptions{cfg.beta1, cfg.beta2, cfg.eps, cfg.fused && fused_adamw_available(device_)});
}

void ReplicatedStrategy::set_up_weight_casts(const TrainConfig& cfg, bool kept_across_steps) {
  if (cfg.dtype == DType::kBf16)
    weight_casts_ = std::make_unique<StepWeightCasts>(model_, at::kBFloat16, kept_across_steps);
}

std::vector<at::Tensor> ReplicatedStrategy::parameters() const {
  std::vector<at::Tensor> params;
  for (const auto& g : groups_) params.push_back(g.param);
  return params;
}

void ReplicatedStrategy::begin_step(int64_t, const std::vector<Batch>& micro) {
  if (embedding_grad_)  // the embedding's gradient rows this step's backward will write
    for (const Batch& b : micro) embedding_grad_->will_touch(b.input_ids);
}

ParameterSource* ReplicatedStrategy::parameter_source(bool training) const {
  return training ? weight_casts_.get() : nullptr;
}

at::Tensor ReplicatedStrategy::head_weight_cast() {
  return weight_casts_ ? weight_casts_->head_weight_cast() : at::Tensor();
}

void ReplicatedStrategy::end_backward() {
  if (weight_casts_) weight_casts_->end_step();
}

nlohmann::json ReplicatedStrategy::layer_grad_norms(int64_t num_layers) {
  std::vector<std::string> names;
  for (const auto& g : groups_) names.push_back(g.name);
  return archspace::layer_grad_norms(names, parameters(), num_layers);
}

std::optional<NamedTensors> ReplicatedStrategy::gradients_to_dump() {
  NamedTensors grads;
  for (const auto& g : groups_) grads.emplace_back(g.name, g.param.grad());
  return grads;
}

double ReplicatedStrategy::clip_gradients(double max_norm) {
  const std::vector<at::Tensor> params = parameters();
  // One process: clipping reads and scales only the embedding rows the step looked up (the rest are zeros).
  std::vector<at::Tensor> nonzero_rows;
  if (embedding_grad_) {
    nonzero_rows.resize(params.size());
    nonzero_rows[static_cast<size_t>(embedding_param_)] = embedding_grad_->touched_rows();
  }
  // The optimizer's one-pass kernel applies the clip's coefficient as it reads each gradient (no pass of its own).
  grad_scale_ = 1;
  if (optimizer_->single_pass(device_)) {
    const GradientClip clip = clip_gradient_norm(params, max_norm, nonzero_rows);
    grad_scale_ = clip.coefficient;
    return clip.norm;
  }
  return clip_grad_norm(params, max_norm, nonzero_rows);
}

void ReplicatedStrategy::optimizer_step(double lr, double weight_decay) {
  RECORD_USER_SCOPE("archspace::optimizer_step");
  const std::vector<at::Tensor> params = parameters();
  // bf16: the optimizer also writes the next step's bf16 weights (StepWeightCasts' copies, kept across steps).
  const std::vector<at::Tensor> copies = weight_casts_ ? weight_casts_->copies_for(params) : std::vector<at::Tensor>{};
  optimizer_->step(lr, weight_decay, grad_scale_, copies);
  if (weight_casts_) weight_casts_->copies_written(params);
}

void ReplicatedStrategy::zero_gradients() {
  for (size_t i = 0; i < groups_.size(); ++i) {
    at::Tensor& grad = groups_[i].param.mutable_grad();
    if (static_cast<int64_t>(i) == embedding_param_)
      embedding_grad_->zero();  // the rows the step's lookups touched: the only nonzero ones
    else
      grad.reset();
  }
}

void ReplicatedStrategy::load(const NamedTensors& parameters, const NamedTensors& optimizer_state, int64_t steps_taken,
                              const std::string& source) {
  {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < groups_.size(); ++i) groups_[i].param.copy_(parameters[i].second);
  }
  optimizer_->load_state(optimizer_state, steps_taken, source);
}

}  // namespace archspace
