#include "archspace/model/layers.h"

#include <cmath>

#include "archspace/model/linear.h"

namespace archspace {

at::ScalarType compute_dtype(const at::Tensor& x) { return at::promote_types(x.scalar_type(), at::kFloat); }

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor xf = x.to(compute_dtype(x));
  at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor normed = xf * at::rsqrt(variance + eps);
  return (weight * normed).to(x.scalar_type());
}

at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& gate_proj, const at::Tensor& up_proj,
                      const at::Tensor& down_proj) {
  return archspace::linear(at::silu(archspace::linear(x, gate_proj)) * archspace::linear(x, up_proj), down_proj);
}

at::Tensor causal_mask(int64_t tq, int64_t tk, int64_t window, int64_t q_offset, const at::Device& device) {
  auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor i = (at::arange(tq, opts) + q_offset).unsqueeze(1);  // query positions [Tq, 1]
  at::Tensor j = at::arange(tk, opts).unsqueeze(0);               // key positions [1, Tk]
  at::Tensor allowed = j <= i;
  if (window > 0) allowed = allowed & (j > i - window);
  return allowed;
}

namespace {

// The causal (and window) mask, narrowed by the padding mask when there is one.
at::Tensor full_mask(int64_t tq, int64_t tk, int64_t window, int64_t q_offset, const at::Tensor& padding_mask,
                     const at::Device& device) {
  at::Tensor allowed = causal_mask(tq, tk, window, q_offset, device);
  return padding_mask.defined() ? allowed & padding_mask : allowed;
}

at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                               int64_t q_offset, const at::Tensor& padding_mask) {
  const int64_t groups = q.size(1) / k.size(1);
  const at::ScalarType dtype = compute_dtype(q);
  at::Tensor kf = k.to(dtype).repeat_interleave(groups, 1);
  at::Tensor vf = v.to(dtype).repeat_interleave(groups, 1);
  at::Tensor scores = at::matmul(q.to(dtype), kf.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor allowed = full_mask(q.size(2), k.size(2), window, q_offset, padding_mask, q.device());
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  at::Tensor probs = at::softmax(scores, -1);
  return at::matmul(probs, vf).to(q.scalar_type());
}

}  // namespace

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                            int64_t q_offset, AttentionImpl impl, const at::Tensor& padding_mask) {
  if (impl == AttentionImpl::kReference) return reference_attention(q, k, v, window, q_offset, padding_mask);
  const int64_t tq = q.size(2), tk = k.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const bool gqa = q.size(1) != k.size(1);
  if (!padding_mask.defined()) {
    const bool plain_causal = q_offset == 0 && tq == tk && (window == 0 || window >= tk);
    if (plain_causal) {
      // is_causal lets the kernels skip masked blocks instead of reading a mask.
      return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, 0.0, /*is_causal=*/true, scale, gqa);
    }
    const bool one_query_sees_all = tq == 1 && q_offset == tk - 1 && (window == 0 || window >= tk);
    if (one_query_sees_all) {  // decoding: no mask to build or read
      return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, 0.0, /*is_causal=*/false, scale, gqa);
    }
  }
  if (window > 0 && tq > 2 * window) {
    // Long sequences under a sliding window: attend block by block, each query block reading only the
    // keys its window reaches, so memory grows with T * window instead of T^2 (65,536-token contexts).
    std::vector<at::Tensor> blocks;
    for (int64_t s = 0; s < tq; s += window) {
      const int64_t e = std::min(tq, s + window);
      const int64_t k0 = std::max<int64_t>(0, s + q_offset - (window - 1)), k1 = std::min(tk, e + q_offset);
      at::Tensor block_padding =
          padding_mask.defined() ? padding_mask.narrow(2, s, e - s).narrow(3, k0, k1 - k0) : at::Tensor();
      at::Tensor mask = full_mask(e - s, k1 - k0, window, s + q_offset - k0, block_padding, q.device());
      blocks.push_back(at::scaled_dot_product_attention(q.narrow(2, s, e - s), k.narrow(2, k0, k1 - k0),
                                                        v.narrow(2, k0, k1 - k0), mask, 0.0, false, scale, gqa));
    }
    return at::cat(blocks, 2);
  }
  at::Tensor mask = full_mask(tq, tk, window, q_offset, padding_mask, q.device());
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, scale, gqa);
}

}  // namespace archspace
