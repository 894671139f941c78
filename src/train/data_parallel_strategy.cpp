// Data-parallel under torchrun: every rank holds the whole model, computes its share of the global batch, and the
// gradients are all-reduced during the step's last backward (GradientReducer). With train.sharding = "optimizer"
// (ZeRO-1) each rank keeps the AdamW moments of, and updates, its share of the parameters, then broadcasts it.
#include <c10/core/GradMode.h>

#include <algorithm>
#include <numeric>

#include "archspace/train/replicated_strategy.h"

namespace archspace {

namespace {

class DataParallelStrategy final : public ReplicatedStrategy {
 public:
  explicit DataParallelStrategy(const StrategySetup& setup)
      : ReplicatedStrategy(setup), dist_(*setup.dist), cp_(setup.cp), rank_(dist_.rank()), world_(dist_.world_size()) {
    const std::vector<at::Tensor> params = parameters();
    reducer_ = std::make_unique<GradientReducer>(dist_, params);
    if (setup.cfg.sharding == Sharding::kOptimizer) {
      // Balanced by size: the largest parameters first, each to the rank holding the fewest elements.
      std::vector<size_t> order(params.size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
      std::vector<int64_t> load(world_, 0);
      owner_.assign(params.size(), 0);
      for (size_t i : order) {
        owner_[i] = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
        load[owner_[i]] += params[i].numel();
      }
      std::vector<bool> owned(params.size());
      for (size_t i = 0; i < params.size(); ++i) owned[i] = owner_[i] == rank_;
      optimizer_->shard(owned);
      std::string shares;
      for (int r = 0; r < world_; ++r) shares += (r ? " / " : "") + std::to_string(load[r]);
      setup.progress.note("ZeRO-1: the ranks keep the AdamW moments of " + shares + " parameter elements");
    }
    // ZeRO-1: the owners' updates arrive by broadcast, which the kept casts would miss: cast every step.
    set_up_weight_casts(setup.cfg, /*kept_across_steps=*/owner_.empty());
  }

  void sum_over_ranks(at::Tensor& t, const std::string& what) override { dist_.all_reduce_sum(t, what); }
  at::Tensor global_batch_ids(const at::Tensor& ids, const std::string& what) override {
    return gather_global_batch(dist_, cp_, ids, what);
  }

  void backward(at::Tensor loss, int64_t step, bool last) override {
    // The reducer averages over ranks; x world makes it the sum (exact for a power-of-two world).
    loss = loss * static_cast<double>(world_);
    if (last) {  // only the step's last backward all-reduces (the accumulated gradients)
      reducer_->arm();
      dist_.guard("the gradient all-reduce of step " + std::to_string(step + 1), [&] { loss.backward(); });
    } else {
      loss.backward();
    }
  }

  // Rank 0 reports for all: the gradients are the same on every rank.
  nlohmann::json layer_grad_norms(int64_t num_layers) override {
    return rank_ == 0 ? ReplicatedStrategy::layer_grad_norms(num_layers) : nlohmann::json();
  }
  std::optional<NamedTensors> gradients_to_dump() override {
    if (rank_ != 0) return std::nullopt;
    return ReplicatedStrategy::gradients_to_dump();
  }

  void optimizer_step(double lr, double weight_decay) override {
    ReplicatedStrategy::optimizer_step(lr, weight_decay);
    broadcast_updates();
  }

  // The whole state, whatever the sharding: each owner broadcasts its moments (rank 0 keeps them).
  NamedTensors optimizer_state() override {
    if (owner_.empty()) return optimizer_->state();
    NamedTensors full;
    for (size_t i = 0; i < groups_.size(); ++i) {
      auto [m, v] = optimizer_->moments(i);
      for (auto [name, t] : {std::pair{"exp_avg.", m}, std::pair{"exp_avg_sq.", v}}) {
        if (!t.defined()) t = at::empty_like(groups_[i].param, at::MemoryFormat::Contiguous);
        if (owner_[i] != 0) dist_.broadcast(t, owner_[i], std::string("gathering ") + name + groups_[i].name);
        full.emplace_back(name + groups_[i].name, t);
      }
    }
    return full;
  }

  void broadcast_parameters() override {
    c10::NoGradGuard no_grad;
    for (auto& g : groups_) dist_.broadcast(g.param, 0, "broadcasting parameter " + g.name + " from rank 0");
  }

  bool shards_optimizer() const override { return !owner_.empty(); }

 private:
  // ZeRO-1: each parameter's owner updated it; every rank takes the new values from there.
  void broadcast_updates() {
    if (owner_.empty()) return;
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < groups_.size(); ++i)
      dist_.broadcast(groups_[i].param, owner_[i], "broadcasting the update of " + groups_[i].name);
  }

  DistGroup& dist_;
  ContextParallelism* cp_;
  int rank_, world_;
  std::unique_ptr<GradientReducer> reducer_;
  std::vector<int> owner_;  // ZeRO-1: the rank that updates each parameter; empty when not sharded
};

}  // namespace

std::unique_ptr<GradientStrategy> make_data_parallel_strategy(const StrategySetup& setup) {
  return std::make_unique<DataParallelStrategy>(setup);
}

}  // namespace archspace
