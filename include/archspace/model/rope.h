// Rotary position embeddings, plain and YaRN (SPEC.md section 1). Tables are built in fp32 with the same
// operations, in the same order, as transformers' Olmo3RotaryEmbedding, so that they agree bit for bit.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <mutex>

#include "archspace/config/model_config.h"
#include "archspace/kernels/dispatch.h"

namespace archspace {

// inv_freq_i = theta^(-2i/h), i < h/2, fp32.
at::Tensor plain_inv_freq(int64_t head_dim, double theta);

struct YarnFrequencies {
  at::Tensor inv_freq;      // fp32 [h/2]
  double attention_factor;  // m: multiplies the cos and sin tables
  int64_t low, high;        // the correction range of the ramp
};
YarnFrequencies yarn_inv_freq(int64_t head_dim, double theta, const YarnScaling& yarn);

// Rope::cached_tables' tables (rows = positions 0 .. rows-1), guarded for the threads that share a model.
struct RopeTableCache {
  std::mutex mutex;
  at::Tensor cos, sin;
  int64_t rows = 0;
};

// The RoPE of one layer type: frequencies and the factor the tables carry.
struct Rope {
  at::Tensor inv_freq;  // fp32 [h/2], on the CPU
  double attention_factor = 1.0;

  // cos and sin tables, fp32 [..., h], for int64 positions [...] (e.g. [T] or [B, T]), on `positions`' device.
  std::pair<at::Tensor, at::Tensor> tables(const at::Tensor& positions) const;

  // The same rows looked up in tables of positions 0 .. N-1 kept across calls (N grows by doubling to cover
  // `end`, every position being below it, and stops at `max_positions`). For decoding: its positions are late
  // in the sequence, where fp32 sin and cos of large angles take ATen's slow argument reduction (52 us for
  // 128 values, every step, seen in a profile), while a lookup is a copy. Each row is tables() of its position.
  std::pair<at::Tensor, at::Tensor> cached_tables(const at::Tensor& positions, int64_t end,
                                                  int64_t max_positions) const;

  // cached_tables for positions first .. end - 1 (an unpadded batch's), [end - first, h]: views of the kept
  // tables' rows, with no positions tensor and no lookup (a decode step's RoPE would otherwise cost an arange and
  // four index_selects).
  std::pair<at::Tensor, at::Tensor> cached_rows(int64_t first, int64_t end, int64_t max_positions,
                                                const at::Device& device) const;

  std::shared_ptr<RopeTableCache> cache = std::make_shared<RopeTableCache>();  // shared by copies (same tables)
};

// Sliding layers always get plain RoPE; full layers get YaRN when config.rope_scaling is set.
Rope rope_for(const ModelConfig& config, LayerType type);

// Rotate-half RoPE on x [B, heads, T, h], computed in fp32 and cast back to x's dtype.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The Q/K path: rms_norm over x [B, T, H * head_dim] (the whole projection width), then apply_rope on its heads;
// returns [B, H, T, head_dim]. One pass on the CPU without gradients (fused_rms_norm_rope, the same values as
// fused_rms_norm then fused_rope), else the two ops.
at::Tensor rms_norm_rope(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                         const at::Tensor& sin, int64_t head_dim, KernelChoices kernels = {});

}  // namespace archspace
