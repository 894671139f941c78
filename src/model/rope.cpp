#include "archspace/model/rope.h"

#include <algorithm>
#include <cmath>

#include "archspace/kernels/fused_norm_rope.h"
#include "archspace/kernels/fused_training.h"
#include "archspace/model/rms_norm.h"

namespace archspace {

namespace {
// theta^(2i/h) for i < h/2, fp32, as `base ** (arange(0, h, 2).float() / h)`.
at::Tensor pos_freqs(int64_t head_dim, double theta) {
  at::Tensor exponents = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(head_dim);
  return at::pow(theta, exponents);
}
}  // namespace

at::Tensor plain_inv_freq(int64_t head_dim, double theta) { return at::reciprocal(pos_freqs(head_dim, theta)); }

YarnFrequencies yarn_inv_freq(int64_t head_dim, double theta, const YarnScaling& yarn) {
  const double kPi = 3.14159265358979323846;
  const double h = static_cast<double>(head_dim);
  // dim(n): the rotary dimension index that makes n full rotations over the original context.
  auto correction_dim = [&](double rotations) {
    return h * std::log(static_cast<double>(yarn.original_max_position_embeddings) / (rotations * 2 * kPi)) /
           (2 * std::log(theta));
  };
  int64_t low = std::max<int64_t>(static_cast<int64_t>(std::floor(correction_dim(yarn.beta_fast))), 0);
  int64_t high = std::min<int64_t>(static_cast<int64_t>(std::ceil(correction_dim(yarn.beta_slow))), head_dim / 2 - 1);

  at::Tensor freqs = pos_freqs(head_dim, theta);
  at::Tensor inv_extrapolation = at::reciprocal(freqs);
  at::Tensor inv_interpolation = at::reciprocal(freqs * yarn.factor);
  double hi = static_cast<double>(high), lo = static_cast<double>(low);
  if (hi == lo) hi += 0.001;  // avoid a zero-width ramp
  at::Tensor ramp = at::clamp((at::arange(head_dim / 2, at::kFloat) - lo) / (hi - lo), 0, 1);
  at::Tensor extrapolation_weight = 1 - ramp;
  at::Tensor inv_freq = inv_interpolation * (1 - extrapolation_weight) + inv_extrapolation * extrapolation_weight;
  double m = yarn.attention_factor ? *yarn.attention_factor : 0.1 * std::log(yarn.factor) + 1.0;
  return {inv_freq, m, low, high};
}

Rope rope_for(const ModelConfig& config, LayerType type) {
  if (type == LayerType::kFull && config.rope_scaling) {
    YarnFrequencies y = yarn_inv_freq(config.head_dim, config.rope_theta, *config.rope_scaling);
    return {y.inv_freq, y.attention_factor};
  }
  return {plain_inv_freq(config.head_dim, config.rope_theta), 1.0};
}

std::pair<at::Tensor, at::Tensor> Rope::tables(const at::Tensor& positions) const {
  at::Tensor inv = inv_freq.to(positions.device());
  // An outer product of fp32 values: each angle is one correctly rounded product, as in transformers.
  at::Tensor angles = positions.to(at::kFloat).unsqueeze(-1) * inv;  // [..., T, h/2]
  at::Tensor emb = at::cat({angles, angles}, -1);                    // [..., T, h]
  return {emb.cos() * attention_factor, emb.sin() * attention_factor};
}

namespace {

// The kept tables, grown to cover `end` (the tensors stay alive for the caller even if another thread grows them).
std::pair<at::Tensor, at::Tensor> kept_tables(const Rope& rope, int64_t end, int64_t max_positions,
                                              const at::Device& device) {
  RopeTableCache& cache = *rope.cache;
  std::lock_guard<std::mutex> lock(cache.mutex);
  const bool same_device = cache.cos.defined() && cache.cos.device() == device;
  if (!same_device || cache.rows < end) {
    int64_t rows = std::max<int64_t>(same_device ? cache.rows : 0, 64);
    while (rows < end) rows *= 2;
    rows = std::min(rows, std::max(max_positions, end));
    auto [c, s] = rope.tables(at::arange(rows, at::TensorOptions().dtype(at::kLong).device(device)));
    cache.cos = c;
    cache.sin = s;
    cache.rows = rows;
  }
  return {cache.cos, cache.sin};
}

}  // namespace

std::pair<at::Tensor, at::Tensor> Rope::cached_rows(int64_t first, int64_t end, int64_t max_positions,
                                                    const at::Device& device) const {
  auto [cos, sin] = kept_tables(*this, end, max_positions, device);
  return {cos.narrow(0, first, end - first), sin.narrow(0, first, end - first)};
}

std::pair<at::Tensor, at::Tensor> Rope::cached_tables(const at::Tensor& positions, int64_t end,
                                                      int64_t max_positions) const {
  auto [cos, sin] = kept_tables(*this, end, max_positions, positions.device());
  std::vector<int64_t> shape = positions.sizes().vec();
  shape.push_back(cos.size(1));
  const at::Tensor flat = positions.reshape({-1});
  return {cos.index_select(0, flat).view(shape), sin.index_select(0, flat).view(shape)};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (rope_kernel(x, cos, sin) == Kernel::kFusedInference) return fused_rope(x, cos, sin);  // inference, CPU: one pass
  const int64_t half = x.size(-1) / 2;
  at::Tensor xf = x.to(compute_dtype(x));
  at::Tensor rotated = at::cat({-xf.narrow(-1, half, half), xf.narrow(-1, 0, half)}, -1);
  return (xf * cos + rotated * sin).to(x.scalar_type());
}

at::Tensor rms_norm_rope(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                         const at::Tensor& sin, int64_t head_dim, KernelChoices kernels) {
  switch (rms_norm_rope_kernel(x, weight, cos, sin, head_dim, kernels)) {
    case Kernel::kFusedInference:
      return fused_rms_norm_rope(x, weight, eps, cos, sin, head_dim);
    case Kernel::kFusedTrainingCpu:
    case Kernel::kFusedTrainingCuda:  // train.fused_kernels
      return fused_rms_norm_rope_trained(x, weight, eps, cos, sin, head_dim);
    default:
      break;
  }
  const at::Tensor normed = rms_norm(x, weight, eps, kernels);
  return apply_rope(normed.view({x.size(0), x.size(1), -1, head_dim}).transpose(1, 2), cos, sin);
}

}  // namespace archspace
