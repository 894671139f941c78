#include "archspace/infer/kv_cache.h"

namespace archspace {

KVCache::KVCache(const ModelConfig& config)
    : types_(config.layer_types), window_(config.sliding_window), k_(config.num_hidden_layers), v_(config.num_hidden_layers) {}

KVCache::View KVCache::append(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  at::Tensor& ck = k_[layer];
  at::Tensor& cv = v_[layer];
  const int64_t previous = ck.defined() ? ck.size(2) : 0;
  at::Tensor all_k = previous ? at::cat({ck, k}, 2) : k;
  at::Tensor all_v = previous ? at::cat({cv, v}, 2) : v;
  if (types_[layer] == LayerType::kSliding) {
    // Keep the last window - 1 positions: a later query at p sees p - window + 1 .. p.
    const int64_t keep = std::min<int64_t>(all_k.size(2), window_ - 1);
    ck = all_k.narrow(2, all_k.size(2) - keep, keep).contiguous();
    cv = all_v.narrow(2, all_v.size(2) - keep, keep).contiguous();
  } else {
    ck = all_k;
    cv = all_v;
  }
  return {all_k, all_v, previous};
}

int64_t KVCache::bytes() const { return bytes(LayerType::kSliding) + bytes(LayerType::kFull); }

int64_t KVCache::bytes(LayerType type) const {
  int64_t n = 0;
  for (size_t l = 0; l < k_.size(); ++l) {
    if (types_[l] != type || !k_[l].defined()) continue;
    n += k_[l].numel() * k_[l].element_size() + v_[l].numel() * v_[l].element_size();
  }
  return n;
}

int64_t KVCache::cached_positions(int64_t layer) const { return k_[layer].defined() ? k_[layer].size(2) : 0; }

}  // namespace archspace
