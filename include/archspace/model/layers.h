// The small building blocks of the OLMo 3 decoder (SPEC.md section 1): RMSNorm, SwiGLU MLP and causal
// (sliding-window or full) attention with GQA.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace archspace {

// Norms, RoPE and softmax run in fp32, or wider when the activations are (fp64 gradient checks).
at::ScalarType compute_dtype(const at::Tensor& x);

// RMS_w(x) = w * (x * rsqrt(mean(x^2) + eps)), computed in fp32 and cast back to x's dtype.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// down(silu(gate(x)) * up(x)); weights in nn.Linear layout [out, in].
at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& gate_proj, const at::Tensor& up_proj,
                      const at::Tensor& down_proj);

enum class AttentionImpl {
  kSdpa,       // LibTorch's fused scaled_dot_product_attention (flash/efficient kernels where available)
  kReference,  // explicit fp32 scores, mask and softmax: slow, obviously right, what tests compare against
};

// Which keys query i may see: keys j with i - window < j <= i (window > 0), or all j <= i (window == 0).
// Queries sit at absolute positions q_offset .. q_offset + Tq - 1 and keys at 0 .. Tk - 1.
// Returns a bool mask [Tq, Tk], true where attention is allowed.
at::Tensor causal_mask(int64_t tq, int64_t tk, int64_t window, int64_t q_offset, const at::Device& device);

// q [B, H, Tq, h]; k, v [B, G, Tk, h] with H a multiple of G (query head j reads kv head j / (H/G)).
// Scale 1/sqrt(h). `padding_mask` ([B, 1, Tq, Tk] bool, optional) further restricts the causal mask
// (left-padded batches, see KVCache). Returns [B, H, Tq, h] in q's dtype.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                            int64_t q_offset, AttentionImpl impl, const at::Tensor& padding_mask = {});

}  // namespace archspace
