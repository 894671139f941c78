// The OLMo 3 MLP (SPEC.md section 1): SwiGLU.
#pragma once

#include <ATen/ATen.h>

#include "archspace/kernels/dispatch.h"

namespace archspace {

// down(silu(gate(x)) * up(x)); weights in nn.Linear layout [out, in]. The matmuls' and the product's kernels are
// kernels/dispatch.h's (linear_kernel: FP8 under kernels.fp8; swiglu_kernel: fused under kernels.fused).
at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& gate_proj, const at::Tensor& up_proj,
                      const at::Tensor& down_proj, KernelChoices kernels = {});

}  // namespace archspace
