// RMSNorm (SPEC.md section 1) and the precision the model's norms, RoPE and softmax compute in.
#pragma once

#include <ATen/ATen.h>

#include "archspace/kernels/dispatch.h"

namespace archspace {

// Norms, RoPE and softmax run in fp32, or wider when the activations are (fp64 gradient checks).
at::ScalarType compute_dtype(const at::Tensor& x);

// RMS_w(x) = w * (x * rsqrt(mean(x^2) + eps)), computed in fp32 and cast back to x's dtype. Its kernel is
// kernels/dispatch.h's rms_norm_kernel: the one-pass CPU kernel without gradients, the fused training kernel where
// the run chose it (`kernels`), else ATen's ops.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, KernelChoices kernels = {});

// residual + rms_norm(x, weight, eps): one pass on the CPU without gradients (fused_add_rms_norm, the same values as
// the two ops on that path) or the fused training kernel (add_rms_norm_kernel), else the two ops.
at::Tensor add_rms_norm(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps,
                        KernelChoices kernels = {});

}  // namespace archspace
