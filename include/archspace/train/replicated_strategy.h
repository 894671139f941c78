// What the single-process and data-parallel strategies share (train/gradient_strategy.h): every rank holds the
// whole model and its gradients, the optimizer updates the model's own parameters, and bf16 training reads the
// step's casts of the matmul weights (train/weight_casts.h).
#pragma once

#include "archspace/train/embedding_gradient.h"
#include "archspace/train/gradient_strategy.h"
#include "archspace/train/weight_casts.h"

namespace archspace {

class ReplicatedStrategy : public GradientStrategy {
 public:
  // The parameter groups (norms and SiameseNorm scales do not decay unless asked) and the optimizer.
  explicit ReplicatedStrategy(const StrategySetup& setup);

  void begin_step(int64_t step, const std::vector<Batch>& micro) override;
  ParameterSource* parameter_source(bool training) const override;
  bool sparse_embedding_gradient(bool training) const override { return training && embedding_grad_ != nullptr; }
  at::Tensor head_weight() override { return model_.head_weight(); }
  at::Tensor head_weight_cast() override;
  void end_backward() override;
  nlohmann::json layer_grad_norms(int64_t num_layers) override;
  std::optional<NamedTensors> gradients_to_dump() override;
  double clip_gradients(double max_norm) override;
  void optimizer_step(double lr, double weight_decay) override;
  void zero_gradients() override;
  void release_after_forward() override {}
  std::unique_ptr<CausalLM> whole_model(const CausalLM&, at::Device) override { return nullptr; }
  NamedTensors optimizer_state() override { return optimizer_->state(); }
  void load(const NamedTensors& parameters, const NamedTensors& optimizer_state, int64_t steps_taken,
            const std::string& source) override;
  void broadcast_parameters() override {}

 protected:
  std::vector<at::Tensor> parameters() const;
  // bf16: the matmul weights cast once, then rewritten by each optimizer step, not cast once per micro-batch and
  // recomputation. `kept_across_steps` false: something else (ZeRO-1's broadcasts) writes the weights.
  void set_up_weight_casts(const TrainConfig& cfg, bool kept_across_steps);

  CausalLM& model_;
  at::Device device_;
  std::unique_ptr<StepWeightCasts> weight_casts_;
  // One process on the CPU: the embedding's gradient, kept across steps and zeroed row by row
  // (train/embedding_gradient.h), and its index in groups_; null and -1: a dense gradient per step.
  std::unique_ptr<EmbeddingGradient> embedding_grad_;
  int64_t embedding_param_ = -1;
  float grad_scale_ = 1;  // the clip's coefficient, applied by the optimizer's one-pass kernel
};

// The mode's implementations (train/single_process_strategy.cpp, data_parallel_strategy.cpp,
// fully_sharded_strategy.cpp).
std::unique_ptr<GradientStrategy> make_single_process_strategy(const StrategySetup& setup);
std::unique_ptr<GradientStrategy> make_data_parallel_strategy(const StrategySetup& setup);
std::unique_ptr<GradientStrategy> make_fully_sharded_strategy(const StrategySetup& setup);

// The global batch's input ids from every rank's (a context-parallel group's ranks hold the same instances:
// one copy each, in data-parallel order).
at::Tensor gather_global_batch(DistGroup& dist, ContextParallelism* cp, const at::Tensor& ids, const std::string& what);

}  // namespace archspace
