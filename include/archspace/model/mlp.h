// The OLMo 3 MLP (SPEC.md section 1): SwiGLU.
#pragma once

#include <ATen/ATen.h>

namespace archspace {

// down(silu(gate(x)) * up(x)); weights in nn.Linear layout [out, in].
at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& gate_proj, const at::Tensor& up_proj,
                      const at::Tensor& down_proj);

}  // namespace archspace
