// The engine's AdamW update for fp32 CPU tensors: one pass over a parameter that also applies the clip's
// coefficient to the gradient and, when asked, writes the updated weight rounded to bf16 (the next step's
// matmul weight in bf16 training, train/weight_casts.h). Separately those are three more passes over memory
// per step: scaling the gradients (read + write 4 bytes a parameter), AdamW itself, and casting the weights
// (read 4, write 2); on a 2-core CPU the 190M model's scaling and casting took ~0.04 s each, against ~0.13 s
// for the update.
//
// The arithmetic is torch.optim.AdamW's single-tensor path (AdamW::step's loop), op for op in fp32:
//   g = grad * grad_scale                      (clip_grad_norm_'s mul_ by its coefficient)
//   p = p * (1 - lr * weight_decay)
//   m = m + (1 - beta1) * (g - m)              (lerp_: one fused multiply-add, as ATen's lerp kernel; for
//                                               1 - beta1 >= 0.5, g - beta1 * (g - m) as it has it)
//   v = v * beta2 + ((1 - beta2) * g) * g      (mul_, then addcmul_: the last product and the sum fused, as
//                                               ATen's vectorised addcmul rounds them)
//   p = p + (-step_size * m) / (sqrt(v) / sqrt(bias_correction2) + eps)   (addcdiv_)
// with step_size = lr / bias_correction1. The AVX2 and scalar kernels perform the same IEEE operations in
// the same order (the file is compiled without contraction), so they agree bit for bit.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "archspace/kernels/cpu_isa.h"

namespace archspace {

// The per-step scalars of one update, in fp32 as ATen's ops round their scalar arguments.
struct AdamWScalars {
  float grad_scale = 1;           // the clip coefficient (1: none)
  float decay = 1;                // 1 - lr * weight_decay
  float lerp_coefficient = 0.1f;  // m moves toward g by (1 - beta1): lerp_ as ATen computes it (adamw_scalars)
  bool lerp_from_grad = false;
  float beta2 = 0.95f, one_minus_beta2 = 0.05f;
  float neg_step_size = 0;  // -lr / bias_correction1
  float bias_correction2_sqrt = 1;
  float eps = 1e-8f;
};

// The scalars of update number `step` (1-based) as AdamW::step forms them in double before rounding.
AdamWScalars adamw_scalars(double lr, double weight_decay, double beta1, double beta2, double eps, int64_t step,
                           float grad_scale);

// One update of n elements in place; `low_precision`, when not null, receives the updated weights rounded to
// bf16 (to nearest even, as at::BFloat16(float)). Runs the kernel for `isa` (scalar where the CPU lacks it),
// over at::parallel_for's threads.
void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, at::BFloat16* low_precision,
                  int64_t n, const AdamWScalars& s, CpuIsa isa = max_cpu_isa());

// The same on tensors: fp32, contiguous, CPU, one shape; `low_precision` undefined or bf16 of that shape.
void adamw_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                  const at::Tensor& exp_avg_sq, const at::Tensor& low_precision, const AdamWScalars& s,
                  CpuIsa isa = max_cpu_isa());

// Whether the tensors above can take adamw_update (otherwise AdamW uses ATen's ops).
bool adamw_kernel_applies(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& low_precision);

}  // namespace archspace
