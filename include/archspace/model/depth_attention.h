// Depth-Attention (SPEC.md section 3.2): cross-layer value mixing, no parameters. Inside layer l's
// attention, after Q/K norm and RoPE, each token's value per kv head becomes a softmax-weighted mix of
// its own value and the already-mixed values of earlier "source" layers, weighted by how well the mean
// query of the head group matches each layer's key. State lives for one forward call only.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace archspace {

// Sources of layer l: { j < l : j % stride == 0 or j >= l - recent_window }, ascending.
std::vector<int64_t> depth_sources(int64_t layer, int64_t stride, int64_t recent_window);

// The mix itself. q [B, H, T, h]; k, v [B, G, T, h] (this layer's post-norm, post-RoPE keys and values);
// source_keys / source_values: the sources' keys and mixed values, each [B, G, T, h].
// Scores qbar . k_j / sqrt(h) for each source, then the layer's own key last; softmax in fp32 (or wider).
// Returns vhat [B, G, T, h] in v's dtype; `weights`, when given, receives the mixing weights alpha
// [B, G, T, S+1] (sources in order, then the layer's own value) in v's dtype.
at::Tensor depth_attention_mix(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::vector<at::Tensor>& source_keys, const std::vector<at::Tensor>& source_values,
                               at::Tensor* weights = nullptr);

// Per-forward record of (key, mixed value) for the layers that later layers read.
class DepthAttentionState {
 public:
  DepthAttentionState(int64_t num_layers, int64_t stride, int64_t recent_window);

  // Mixes layer l's values with its sources' and records (k, vhat) if a later layer will read them.
  // `weights`: as depth_attention_mix's.
  at::Tensor mix(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 at::Tensor* weights = nullptr);
  // Layer-pruning analysis: layer l is removed from the model, so later layers mix over their other sources.
  void drop(int64_t layer) { dropped_[layer] = true; }
  // The source layers layer l mixes over in this forward (depth_sources without dropped layers).
  std::vector<int64_t> sources(int64_t layer) const;

  // For running one layer apart (activation checkpointing, with sources() above): whether later layers
  // read it, and the recorded (key, mixed value) of a layer, read or set.
  bool is_source(int64_t layer) const { return is_source_[layer]; }
  std::pair<at::Tensor, at::Tensor> recorded(int64_t layer) const { return {keys_[layer], values_[layer]}; }
  void record(int64_t layer, const at::Tensor& k, const at::Tensor& vhat) {
    keys_[layer] = k;
    values_[layer] = vhat;
  }

 private:
  int64_t stride_, recent_window_;
  std::vector<at::Tensor> keys_, values_;  // indexed by layer; undefined where not kept
  std::vector<bool> is_source_;            // layer j is a source of some later layer
  std::vector<bool> dropped_;              // removed by drop()
};

}  // namespace archspace
