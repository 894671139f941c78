#include "archspace/train/stability.h"

#include <algorithm>
#include <cmath>

#include "archspace/kernels/gradient_norm.h"

namespace archspace {

using nlohmann::json;

std::vector<double> layer_grad_squares(const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                                       int64_t num_layers) {
  // Sums of squares in double, then square roots: one reduction per parameter, no concatenation.
  std::vector<double> squares(static_cast<size_t>(num_layers) + 2, 0.0);  // embed, head, layers
  const std::string prefix = "model.layers.";
  for (size_t i = 0; i < names.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (!g.defined()) continue;
    const double sq = sum_of_squares(g).item<double>();
    if (names[i].rfind(prefix, 0) == 0) {
      const int64_t l = std::stoll(names[i].substr(prefix.size()));
      if (l >= 0 && l < num_layers) squares[static_cast<size_t>(l) + 2] += sq;
    } else if (names[i].rfind("model.embed_tokens.", 0) == 0) {
      squares[0] += sq;
    } else {
      squares[1] += sq;
    }
  }
  return squares;
}

json layer_grad_norms_of_squares(const std::vector<double>& squares) {
  json out = {{"embed", std::sqrt(squares.at(0))}, {"head", std::sqrt(squares.at(1))}};
  json per_layer = json::array();
  for (size_t l = 2; l < squares.size(); ++l) per_layer.push_back(std::sqrt(squares[l]));
  out["layers"] = per_layer;
  return out;
}

json layer_grad_norms(const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                      int64_t num_layers) {
  return layer_grad_norms_of_squares(layer_grad_squares(names, params, num_layers));
}

std::optional<double> SpikeDetector::check(double loss) const {
  if (factor_ <= 0 || static_cast<int64_t>(recent_.size()) < window_) return std::nullopt;
  std::vector<double> sorted(recent_.begin(), recent_.end());
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
  const double median = sorted[sorted.size() / 2];
  if (loss > factor_ * median) return median;
  return std::nullopt;
}

void SpikeDetector::accept(double loss) {
  if (!std::isfinite(loss)) return;
  recent_.push_back(loss);
  while (static_cast<int64_t>(recent_.size()) > window_) recent_.pop_front();
}

json SpikeDetector::state() const { return json(std::vector<double>(recent_.begin(), recent_.end())); }

void SpikeDetector::restore(const json& losses) {
  recent_.clear();
  for (const auto& l : losses) accept(l.get<double>());
}

}  // namespace archspace
