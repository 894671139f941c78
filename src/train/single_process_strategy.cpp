// One process: the gradients are this process's; on the CPU the embedding's gradient stays allocated and only the
// rows a step touched are zeroed (train/embedding_gradient.h).
#include "archspace/train/replicated_strategy.h"

namespace archspace {

namespace {

class SingleProcessStrategy final : public ReplicatedStrategy {
 public:
  explicit SingleProcessStrategy(const StrategySetup& setup) : ReplicatedStrategy(setup) {
    if (device_.is_cpu()) {
      const auto specs = parameter_specs(model_.config());
      for (size_t i = 0; i < specs.size(); ++i) {
        if (specs[i].kind != ParamKind::kEmbedding || groups_[i].param.is_same(model_.head_weight())) continue;
        embedding_grad_ = std::make_unique<EmbeddingGradient>(groups_[i].param);
        embedding_param_ = static_cast<int64_t>(i);
      }
    }
    set_up_weight_casts(setup.cfg, /*kept_across_steps=*/true);
  }

  void sum_over_ranks(at::Tensor&, const std::string&) override {}
  at::Tensor global_batch_ids(const at::Tensor& ids, const std::string&) override { return ids; }
  void backward(at::Tensor loss, int64_t, bool) override { loss.backward(); }
};

}  // namespace

std::unique_ptr<GradientStrategy> make_single_process_strategy(const StrategySetup& setup) {
  return std::make_unique<SingleProcessStrategy>(setup);
}

}  // namespace archspace
