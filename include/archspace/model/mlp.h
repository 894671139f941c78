// The OLMo 3 MLP (SPEC.md section 1): SwiGLU.
#pragma once

#include <ATen/ATen.h>

namespace archspace {

// down(silu(gate(x)) * up(x)); weights in nn.Linear layout [out, in]. fp8: the three matmuls through
// kernels/fp8_linear.h (training's SequenceOptions::fp8).
at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& gate_proj, const at::Tensor& up_proj,
                      const at::Tensor& down_proj, bool fp8 = false);

}  // namespace archspace
