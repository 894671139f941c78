// Training stability, observed (issue 15 item 3): per-layer gradient norms sampled every N steps, and
// loss spikes measured against the recent losses, with a policy (record, skip the step, or stop).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace archspace {

// L2 norms of the gradients, grouped as {"embed": the embedding, "layers": [one per block: every
// model.layers.{l}. parameter], "head": the final norms and the LM head}. Parameters without a gradient
// count as zero. `names` and `params` are parallel.
nlohmann::json layer_grad_norms(const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                                int64_t num_layers);
// The same in two halves, for gradients spread over ranks (FSDP): each rank's sums of squares (fp64, in the
// order embed, head, layers 0..L-1), summed over the ranks, then the norms.
std::vector<double> layer_grad_squares(const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                                       int64_t num_layers);
nlohmann::json layer_grad_norms_of_squares(const std::vector<double>& squares);

// A loss spike: a step whose loss exceeds `factor` x the median of the last `window` losses (only once
// `window` losses are known). The same rule as the sweep's summary (train/sweep.h, loss_spikes): every
// finite loss joins the window, spikes included, so the two agree on a run's spikes.
class SpikeDetector {
 public:
  SpikeDetector(double factor, int64_t window) : factor_(factor), window_(window) {}
  // The baseline (the window's median) when `loss` is a spike; nullopt otherwise.
  std::optional<double> check(double loss) const;
  void accept(double loss);
  // The window, for checkpoints: a resumed run flags exactly the steps an uninterrupted one would.
  nlohmann::json state() const;
  void restore(const nlohmann::json& losses);

 private:
  double factor_;
  int64_t window_;
  std::deque<double> recent_;
};

}  // namespace archspace
