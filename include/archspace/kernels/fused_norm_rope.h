// RMSNorm and rotary embedding as one pass each over the rows, for inference on the CPU. The ATen forms
// (model/rms_norm.cpp rms_norm: 8 ops; rope.cpp apply_rope: 9 ops) cost a dispatch and a temporary per op, which in
// a decode step is most of the time outside the weight reads: 4 norms and 2 ropes per layer. These compute
// the same values in the same precision (fp32 over fp32 or bf16 activations, one rounding back), without
// autograd: anything autograd must see keeps the ATen forms. Two fuse further what a layer does next: the Q/K norm
// with the rotation of its heads, and the residual add around a normalised sublayer (fewer passes, and less code
// to fetch again after each matrix product's weights have gone through the caches).
#pragma once

#include <ATen/ATen.h>

#include "archspace/kernels/cpu_isa.h"

namespace archspace {

// Whether rms_norm(x, weight, eps) may take fused_rms_norm: CPU, fp32 or bf16 x and weight, x's last dim
// contiguous and equal to weight's size, and no gradient wanted.
bool uses_fused_rms_norm(const at::Tensor& x, const at::Tensor& weight);

// weight * (x * rsqrt(mean(x^2) + eps)) per row, in fp32, rounded to x's dtype. The mean's sum runs in its
// own order (8 lanes), so values may differ from the ATen form by the rounding of a D-term sum.
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, CpuIsa isa = max_cpu_isa());

// Whether residual + rms_norm(x, weight, eps) may take fused_add_rms_norm: as uses_fused_rms_norm, and a
// contiguous residual of x's shape and dtype on the CPU that wants no gradient.
bool uses_fused_add_rms_norm(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight);

// residual + fused_rms_norm(x, weight, eps) in one pass: the norm rounded to x's dtype, then the sum in fp32 rounded
// once, as the separate add rounds, so the result equals the two calls' bit for bit. (A block's residual add around
// a normalised sublayer output: two per layer in OLMo 3, which a decode step would otherwise pay as its own pass
// over the stream.)
at::Tensor fused_add_rms_norm(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps,
                              CpuIsa isa = max_cpu_isa());

// Whether apply_rope(x, cos, sin) may take fused_rope: CPU, x [B, H, T, h] fp32 or bf16 with a contiguous last
// dim, cos and sin fp32 and contiguous, [T, h] or [B, 1, T, h], and no gradient wanted.
bool uses_fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// x * cos + rotate_half(x) * sin in fp32 (each product and the sum rounded once, as the three ATen ops do, so
// the result equals apply_rope's bit for bit), rounded to x's dtype, in x's memory layout.
at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Whether fused_rms_norm_rope may take x [B, T, H * head_dim]: as uses_fused_rms_norm over the whole width, and
// uses_fused_rope for x's heads [B, H, T, head_dim].
bool uses_fused_rms_norm_rope(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                              const at::Tensor& sin, int64_t head_dim);

// fused_rope(fused_rms_norm(x, weight, eps) as heads [B, H, T, head_dim], cos, sin) in one pass (the Q/K norm over
// the whole projection, then each head's rotation), equal to the two calls bit for bit: the normed value is rounded to
// x's dtype before the rotation reads it. Returns [B, H, T, head_dim], a transposed view of [B, T, H, head_dim] as
// the two calls return it.
at::Tensor fused_rms_norm_rope(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                               const at::Tensor& sin, int64_t head_dim, CpuIsa isa = max_cpu_isa());

}  // namespace archspace
