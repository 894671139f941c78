#include "archspace/model/depth_attention.h"

#include <cmath>

#include "archspace/util/error.h"

namespace archspace {

std::vector<int64_t> depth_sources(int64_t layer, int64_t stride, int64_t recent_window) {
  std::vector<int64_t> sources;
  for (int64_t j = 0; j < layer; ++j) {
    if (j % stride == 0 || j >= layer - recent_window) sources.push_back(j);
  }
  return sources;
}

at::Tensor depth_attention_mix(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::vector<at::Tensor>& source_keys, const std::vector<at::Tensor>& source_values,
                               at::Tensor* weights) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), h = q.size(3), G = k.size(1);
  // Depth query: the mean of the H/G query heads that share kv head g (the identity for MHA).
  at::Tensor qbar = q.view({B, G, H / G, T, h}).mean(2);  // [B, G, T, h]
  std::vector<at::Tensor> keys(source_keys), values(source_values);
  keys.push_back(k);
  values.push_back(v);
  at::Tensor K = at::stack(keys, /*dim=*/-2);                                                // [B, G, T, S+1, h]
  at::Tensor V = at::stack(values, /*dim=*/-2);                                              // [B, G, T, S+1, h]
  at::Tensor scores = (qbar.unsqueeze(-2) * K).sum(-1) / std::sqrt(static_cast<double>(h));  // [B, G, T, S+1]
  at::ScalarType softmax_dtype = at::promote_types(scores.scalar_type(), at::kFloat);
  at::Tensor alpha = at::softmax(scores.to(softmax_dtype), -1).to(v.scalar_type());
  if (weights) *weights = alpha;
  return (alpha.unsqueeze(-1) * V).sum(-2);
}

DepthAttentionState::DepthAttentionState(int64_t num_layers, int64_t stride, int64_t recent_window)
    : stride_(stride),
      recent_window_(recent_window),
      keys_(num_layers),
      values_(num_layers),
      is_source_(num_layers),
      dropped_(num_layers) {
  if (stride <= 0) throw Error("depth_attention_stride must be positive");
  for (int64_t l = 1; l < num_layers; ++l) {
    for (int64_t j : depth_sources(l, stride, recent_window)) is_source_[j] = true;
  }
}

std::vector<int64_t> DepthAttentionState::sources(int64_t layer) const {
  std::vector<int64_t> kept;
  for (int64_t j : depth_sources(layer, stride_, recent_window_)) {
    if (!dropped_[j]) kept.push_back(j);
  }
  return kept;
}

at::Tensor DepthAttentionState::mix(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    at::Tensor* weights) {
  std::vector<at::Tensor> source_keys, source_values;
  for (int64_t j : sources(layer)) {
    if (!keys_[j].defined())
      throw Error("Depth-Attention: layer " + std::to_string(j) + " was not recorded before layer " +
                  std::to_string(layer));
    source_keys.push_back(keys_[j]);
    source_values.push_back(values_[j]);
  }
  at::Tensor vhat = depth_attention_mix(q, k, v, source_keys, source_values, weights);
  if (is_source_[layer]) {
    keys_[layer] = k;
    values_[layer] = vhat;
  }
  return vhat;
}

}  // namespace archspace
