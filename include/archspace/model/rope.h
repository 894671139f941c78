// Rotary position embeddings, plain and YaRN (SPEC.md section 1). Tables are built in fp32 with the same
// operations, in the same order, as transformers' Olmo3RotaryEmbedding, so that they agree bit for bit.
#pragma once

#include <ATen/ATen.h>

#include "archspace/config/model_config.h"

namespace archspace {

// inv_freq_i = theta^(-2i/h), i < h/2, fp32.
at::Tensor plain_inv_freq(int64_t head_dim, double theta);

struct YarnFrequencies {
  at::Tensor inv_freq;      // fp32 [h/2]
  double attention_factor;  // m: multiplies the cos and sin tables
  int64_t low, high;        // the correction range of the ramp
};
YarnFrequencies yarn_inv_freq(int64_t head_dim, double theta, const YarnScaling& yarn);

// The RoPE of one layer type: frequencies and the factor the tables carry.
struct Rope {
  at::Tensor inv_freq;  // fp32 [h/2], on the CPU
  double attention_factor = 1.0;

  // cos and sin tables, fp32 [..., h], for int64 positions [...] (e.g. [T] or [B, T]), on `positions`' device.
  std::pair<at::Tensor, at::Tensor> tables(const at::Tensor& positions) const;
};

// Sliding layers always get plain RoPE; full layers get YaRN when config.rope_scaling is set.
Rope rope_for(const ModelConfig& config, LayerType type);

// Rotate-half RoPE on x [B, heads, T, h], computed in fp32 and cast back to x's dtype.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace archspace
