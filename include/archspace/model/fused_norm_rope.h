// RMSNorm and rotary embedding as one pass each over the rows, for inference on the CPU. The ATen forms
// (layers.cpp rms_norm: 8 ops; rope.cpp apply_rope: 9 ops) cost a dispatch and a temporary per op, which in
// a decode step is most of the time outside the weight reads: 4 norms and 2 ropes per layer. These compute
// the same values in the same precision (fp32 over fp32 or bf16 activations, one rounding back), without
// autograd: anything autograd must see keeps the ATen forms.
#pragma once

#include <ATen/ATen.h>

#include "archspace/util/cpu_isa.h"

namespace archspace {

// Whether rms_norm(x, weight, eps) may take fused_rms_norm: CPU, fp32 or bf16 x and weight, x's last dim
// contiguous and equal to weight's size, and no gradient wanted.
bool uses_fused_rms_norm(const at::Tensor& x, const at::Tensor& weight);

// weight * (x * rsqrt(mean(x^2) + eps)) per row, in fp32, rounded to x's dtype. The mean's sum runs in its
// own order (8 lanes), so values may differ from the ATen form by the rounding of a D-term sum.
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, CpuIsa isa = max_cpu_isa());

// Whether apply_rope(x, cos, sin) may take fused_rope: CPU, x [B, H, T, h] fp32 or bf16 with a contiguous last
// dim, cos and sin fp32 and contiguous, [T, h] or [B, 1, T, h], and no gradient wanted.
bool uses_fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// x * cos + rotate_half(x) * sin in fp32 (each product and the sum rounded once, as the three ATen ops do, so
// the result equals apply_rope's bit for bit), rounded to x's dtype, in x's memory layout.
at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace archspace
