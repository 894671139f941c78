#include "archspace/model/layers.h"

#include <cmath>

#include "archspace/model/decode_attention.h"
#include "archspace/model/fused_norm_rope.h"
#include "archspace/model/linear.h"

namespace archspace {

at::ScalarType compute_dtype(const at::Tensor& x) { return at::promote_types(x.scalar_type(), at::kFloat); }

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (uses_fused_rms_norm(x, weight)) return fused_rms_norm(x, weight, eps);  // inference on the CPU: one pass
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

AttentionPath attention_path(AttentionImpl impl, at::Device device, at::ScalarType dtype, int64_t tq, int64_t tk,
                             int64_t head_dim, int64_t window, int64_t q_offset, bool padded) {
  if (impl == AttentionImpl::kReference) return AttentionPath::kReference;
  const bool whole_sequence = !padded && q_offset == 0 && tq == tk;
  // The flash kernel: CUDA, half precision, head sizes it was built for. It takes the window itself, so
  // sliding layers need no mask at any length (the path below this one builds masks block by block).
  const bool half = dtype == at::kBFloat16 || dtype == at::kHalf;
  if (whole_sequence && device.is_cuda() && half && head_dim % 8 == 0 && head_dim <= 256) return AttentionPath::kFlash;
  if (whole_sequence && (window == 0 || window >= tk)) return AttentionPath::kSdpaCausal;
  if (!padded && tq == 1 && q_offset == tk - 1 && (window == 0 || window >= tk)) return AttentionPath::kSdpaNoMask;
  if (window > 0 && tq > 2 * window) return AttentionPath::kSdpaBlocked;
  return AttentionPath::kSdpaMasked;
}

FlashArguments flash_arguments(int64_t window, int64_t head_dim) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  // Sliding: query i sees keys i - (window - 1) .. i, the window counting the query itself. Full: causal.
  if (window > 0) return {/*is_causal=*/false, window - 1, 0, scale};
  return {/*is_causal=*/true, -1, -1, scale};
}

at::Tensor flash_kernel(const at::Tensor& q_BTHD, const at::Tensor& k_BTGD, const at::Tensor& v_BTGD,
                        const FlashArguments& args, bool cpu_stand_in) {
  const int64_t T = q_BTHD.size(1), Tk = k_BTGD.size(1);
  if (!cpu_stand_in) {
    auto opt = [](int64_t w) { return w < 0 ? std::nullopt : std::optional<int64_t>(w); };
    return std::get<0>(at::_flash_attention_forward(q_BTHD, k_BTGD, v_BTGD, std::nullopt, std::nullopt, T, Tk, 0.0,
                                                    args.is_causal, false, args.scale, opt(args.window_left),
                                                    opt(args.window_right)));
  }
  // The kernel's definition, written from its arguments alone (not from causal_mask): query i sees key j
  // when i - left <= j <= i + right (a negative bound is none), and j <= i when is_causal; query head
  // h reads kv head h / (H / G).
  auto opts = at::TensorOptions().dtype(at::kLong).device(q_BTHD.device());
  at::Tensor i = at::arange(T, opts).unsqueeze(1), j = at::arange(Tk, opts).unsqueeze(0);
  at::Tensor allowed = at::ones({T, Tk}, opts.dtype(at::kBool));
  if (args.window_left >= 0) allowed = allowed & (j >= i - args.window_left);
  if (args.window_right >= 0) allowed = allowed & (j <= i + args.window_right);
  if (args.is_causal) allowed = allowed & (j <= i);
  const int64_t groups = q_BTHD.size(2) / k_BTGD.size(2);
  at::Tensor q = q_BTHD.to(at::kFloat).transpose(1, 2);
  at::Tensor k = k_BTGD.to(at::kFloat).transpose(1, 2).repeat_interleave(groups, 1);
  at::Tensor v = v_BTGD.to(at::kFloat).transpose(1, 2).repeat_interleave(groups, 1);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * args.scale;
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), v).transpose(1, 2).to(q_BTHD.scalar_type());
}

at::Tensor flash_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                                  bool cpu_stand_in) {
  // [B, H, T, h] -> the kernel's [B, T, H, h]: views whose last dimension stays contiguous, as it needs.
  const at::ScalarType dtype = q.scalar_type();
  at::Tensor out = flash_kernel(q.transpose(1, 2), k.to(dtype).transpose(1, 2), v.to(dtype).transpose(1, 2),
                                flash_arguments(window, q.size(-1)), cpu_stand_in);
  return out.transpose(1, 2);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                            int64_t q_offset, AttentionImpl impl, const at::Tensor& padding_mask) {
  const int64_t tq = q.size(2), tk = k.size(2);
  const AttentionPath path =
      attention_path(impl, q.device(), q.scalar_type(), tq, tk, q.size(-1), window, q_offset, padding_mask.defined());
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const bool gqa = q.size(1) != k.size(1);
  switch (path) {
    case AttentionPath::kReference:
      return reference_attention(q, k, v, window, q_offset, padding_mask);
    case AttentionPath::kFlash:
      return flash_causal_attention(q, k, v, window);
    case AttentionPath::kSdpaCausal:
      // is_causal lets the kernels skip masked blocks instead of reading a mask.
      return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, 0.0, /*is_causal=*/true, scale, gqa);
    case AttentionPath::kSdpaNoMask:  // decoding: no mask to build or read
      if (uses_decode_attention(q, k, v)) return decode_attention(q, k, v, scale);  // inference on the CPU
      return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, 0.0, /*is_causal=*/false, scale, gqa);
    case AttentionPath::kSdpaBlocked:
    case AttentionPath::kSdpaMasked:
      break;
  }
  if (path == AttentionPath::kSdpaBlocked) {
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
  // Decoding a padded batch (one query at the last slot, every key within its window): the causal mask is all
  // true, so the padding mask is the whole mask.
  const bool decoding = tq == 1 && q_offset == tk - 1 && (window == 0 || window >= tk);
  if (decoding && padding_mask.defined() && uses_decode_attention(q, k, v, padding_mask))
    return decode_attention(q, k, v, scale, padding_mask);
  at::Tensor mask =
      decoding && padding_mask.defined() ? padding_mask : full_mask(tq, tk, window, q_offset, padding_mask, q.device());
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, scale, gqa);
}

}  // namespace archspace
