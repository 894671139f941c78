// KV cache for incremental decoding. Full-attention layers keep every position; sliding layers keep only
// the last sliding_window - 1 positions (all a new query can still see), so their memory is bounded by
// the window whatever the length. For siamese_depth the cached values are the Depth-Attention mixed
// values (SPEC.md section 3.2): nothing else persists between steps.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "archspace/config/model_config.h"

namespace archspace {

class KVCache {
 public:
  explicit KVCache(const ModelConfig& config);

  // Positions consumed so far (the next token's position).
  int64_t length() const { return length_; }

  struct View {
    at::Tensor k, v;   // [B, G, S, h]: the keys and values this chunk's queries attend over
    int64_t q_offset;  // position of the first query relative to the first key of the view
  };
  // Adds a chunk's keys and values [B, G, T, h] for `layer` (called once per layer per forward).
  View append(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  // Marks the chunk as consumed by every layer.
  void advance(int64_t tokens) { length_ += tokens; }

  int64_t bytes() const;                 // all layers
  int64_t bytes(LayerType type) const;   // layers of one type
  int64_t cached_positions(int64_t layer) const;

 private:
  std::vector<LayerType> types_;
  int64_t window_;
  int64_t length_ = 0;
  std::vector<at::Tensor> k_, v_;
};

}  // namespace archspace
