// train.sharding = "full" (FSDP; HSDP with train.replicate_groups): the optimizer updates this rank's shards and
// the model's own tensors are released; the forward reads the weights through FullyShardedModel
// (train/fully_sharded.h), which gathers each unit as it runs and reduce-scatters its gradients.
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include "archspace/train/replicated_strategy.h"

namespace archspace {

namespace {

class FullyShardedStrategy final : public GradientStrategy {
 public:
  explicit FullyShardedStrategy(const StrategySetup& setup)
      : dist_(*setup.dist),
        cp_(setup.cp),
        reduce_each_micro_batch_(setup.cfg.reduce_each_micro_batch),
        replicate_groups_(setup.cfg.replicate_groups) {
    const int rank = dist_.rank();
    // HSDP: shard within groups of consecutive ranks, replicate across them; FSDP: one group, the world.
    if (setup.layout && setup.layout->replicate_groups > 1) {
      const ShardLayout& layout = *setup.layout;
      const int group = rank / layout.shard_size(), place = rank % layout.shard_size();
      shard_group_ = dist_.subgroup(layout.shard_group_of(rank), "HSDP shard group " + std::to_string(group));
      replicate_group_ =
          dist_.subgroup(layout.replicate_group_of(rank), "HSDP replicate group " + std::to_string(place));
    }
    // The ranks start from rank 0's weights, as broadcast_parameters() makes them otherwise.
    {
      c10::NoGradGuard no_grad;
      for (const auto& [name, p] : setup.model.parameters()) {
        at::Tensor t = p;  // the same tensor
        dist_.broadcast(t, 0, "broadcasting parameter " + name + " from rank 0");
      }
    }
    DistGroup& shards = shard_group_ ? *shard_group_ : dist_;
    fsdp_ = std::make_unique<FullyShardedModel>(setup.model, shards, replicate_group_.get(), setup.cfg.decay_embeddings,
                                                setup.cfg.decay_norms);
    groups_ = fsdp_->optimizer_groups();
    optimizer_ = std::make_unique<AdamW>(groups_, AdamWOptions{setup.cfg.beta1, setup.cfg.beta2, setup.cfg.eps,
                                                               setup.cfg.fused && fused_adamw_available(setup.device)});
    const int64_t total = parameter_count(setup.model.config());
    std::string layout = "FSDP: parameters, gradients and AdamW moments sharded over " +
                         std::to_string(shards.world_size()) + " ranks (" + std::to_string(fsdp_->shard_elements()) +
                         " of " + std::to_string(total) + " parameter elements per rank)";
    if (replicate_group_)
      layout += ", replicated over " + std::to_string(replicate_group_->world_size()) + " groups (HSDP)";
    setup.progress.note(layout);
  }

  void sum_over_ranks(at::Tensor& t, const std::string& what) override { dist_.all_reduce_sum(t, what); }
  at::Tensor global_batch_ids(const at::Tensor& ids, const std::string& what) override {
    return gather_global_batch(dist_, cp_, ids, what);
  }

  void begin_step(int64_t step, const std::vector<Batch>&) override { fsdp_->begin_step(step); }
  // Each unit's weights gathered as it runs.
  ParameterSource* parameter_source(bool) const override { return fsdp_.get(); }
  bool sparse_embedding_gradient(bool) const override { return false; }
  at::Tensor head_weight() override { return fsdp_->head().lm_head; }
  at::Tensor head_weight_cast() override { return at::Tensor(); }

  void backward(at::Tensor loss, int64_t, bool last) override {
    // Each unit's gradients are reduce-scattered (summed over the ranks) as its backward completes; the
    // micro-batches' sums accumulate in the shards' gradients. Or, with train.reduce_each_micro_batch =
    // false, in each rank's unsharded sums until the step's last micro-batch reduces them.
    fsdp_->set_gradient_sync(reduce_each_micro_batch_ || last);
    loss.backward();
    fsdp_->finish_backward();
  }
  void end_backward() override {}

  // Collective: every rank's shards make the norms.
  nlohmann::json layer_grad_norms(int64_t num_layers) override { return fsdp_->layer_grad_norms(num_layers); }
  std::optional<NamedTensors> gradients_to_dump() override {
    NamedTensors grads = fsdp_->full_gradients(at::kCPU);  // every rank takes part; rank 0 writes
    if (dist_.rank() != 0) return std::nullopt;
    return grads;
  }
  // The norm of the whole gradient from every rank's shards (collective).
  double clip_gradients(double max_norm) override { return fsdp_->clip_grad_norm(max_norm); }
  void optimizer_step(double lr, double weight_decay) override {
    RECORD_USER_SCOPE("archspace::optimizer_step");
    fsdp_->attach_gradients();  // each optimizer group's part of the (clipped) shard gradients
    optimizer_->step(lr, weight_decay, 1.0f, {});
  }
  void zero_gradients() override { fsdp_->zero_gradients(); }

  void release_after_forward() override { fsdp_->release(); }
  // The whole parameters, gathered unit by unit (every rank takes part): the memory of one unsharded model.
  std::unique_ptr<CausalLM> whole_model(const CausalLM& model, at::Device device) override {
    return std::make_unique<CausalLM>(model.config(), fsdp_->full_parameters(device));
  }
  NamedTensors optimizer_state() override { return fsdp_->full_optimizer_state(*optimizer_, at::kCPU); }
  void load(const NamedTensors& parameters, const NamedTensors& optimizer_state, int64_t steps_taken,
            const std::string& source) override {
    fsdp_->load_full_parameters(parameters);  // this rank's shards of them
    fsdp_->load_full_optimizer_state(*optimizer_, optimizer_state, steps_taken, source);
  }
  // The shards were cut from rank 0's weights, or from the one checkpoint every rank read.
  void broadcast_parameters() override {}
  int64_t replicate_groups() const override { return replicate_groups_; }

 private:
  DistGroup& dist_;
  ContextParallelism* cp_;
  bool reduce_each_micro_batch_;
  int64_t replicate_groups_;
  // HSDP: the ranks sharing the parameters and the ranks holding the same shard (null under plain FSDP).
  std::unique_ptr<DistGroup> shard_group_, replicate_group_;
  std::unique_ptr<FullyShardedModel> fsdp_;
};

}  // namespace

std::unique_ptr<GradientStrategy> make_fully_sharded_strategy(const StrategySetup& setup) {
  return std::make_unique<FullyShardedStrategy>(setup);
}

}  // namespace archspace
