#include "archspace/train/skip_step.h"

#include <ATen/ATen.h>

#include <vector>

#include "archspace/util/error.h"

namespace archspace {

namespace {

void push(std::deque<float>& values, double value, int64_t window) {
  values.push_back(static_cast<float>(value));  // OLMo-core's fp32 loss and norm tensors
  while (static_cast<int64_t>(values.size()) > window + 1) values.pop_front();
}

// torch.std_mean(torch.stack(values[:-1])) and (latest - mean) <= sigma * std, in fp32 as OLMo-core computes them.
bool within(const std::deque<float>& values, double sigma, float& mean_out, float& std_out) {
  const std::vector<float> earlier(values.begin(), values.end() - 1);
  const at::Tensor t = at::from_blob(const_cast<float*>(earlier.data()), {static_cast<int64_t>(earlier.size())},
                                     at::TensorOptions(at::kFloat));
  const auto [std_dev, mean] = at::std_mean(t);
  const at::Tensor latest = at::scalar_tensor(values.back(), at::kFloat);
  mean_out = mean.item<float>();
  std_out = std_dev.item<float>();
  return ((latest - mean) <= std_dev * sigma).item<bool>();
}

std::deque<float> read_values(const nlohmann::json& j, const char* key) {
  std::deque<float> out;
  if (!j.contains(key)) return out;
  if (!j.at(key).is_array()) throw Error(std::string("trainer state: skip_step_window.") + key + " is not a list");
  for (const auto& v : j.at(key)) {
    if (!v.is_number()) throw Error(std::string("trainer state: skip_step_window.") + key + " holds a non-number");
    out.push_back(v.get<float>());
  }
  return out;
}

}  // namespace

SkipStepRule::Verdict SkipStepRule::observe(double loss, double grad_norm) {
  push(losses_, loss, window_);
  if (use_grad_norms_) push(grad_norms_, grad_norm, window_);
  Verdict v;
  if (static_cast<int64_t>(losses_.size()) < std::max<int64_t>(2, window_ / 2)) return v;
  v.checked = true;
  bool proceed = within(losses_, sigma_, v.loss_mean, v.loss_std);
  if (use_grad_norms_ && !grad_norms_.empty())
    proceed = within(grad_norms_, sigma_, v.grad_norm_mean, v.grad_norm_std) && proceed;
  v.skip = !proceed;
  return v;
}

nlohmann::json SkipStepRule::state() const {
  return {{"losses", nlohmann::json(std::vector<float>(losses_.begin(), losses_.end()))},
          {"grad_norms", nlohmann::json(std::vector<float>(grad_norms_.begin(), grad_norms_.end()))}};
}

void SkipStepRule::restore(const nlohmann::json& state) {
  if (!state.is_object()) throw Error("trainer state: skip_step_window is not an object");
  losses_ = read_values(state, "losses");
  grad_norms_ = read_values(state, "grad_norms");
  while (static_cast<int64_t>(losses_.size()) > window_ + 1) losses_.pop_front();
  while (static_cast<int64_t>(grad_norms_.size()) > window_ + 1) grad_norms_.pop_front();
}

}  // namespace archspace
