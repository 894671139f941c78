#include "archspace/model/mlp.h"

#include "archspace/kernels/fp8_linear.h"
#include "archspace/kernels/fused_training.h"
#include "archspace/kernels/linear.h"

namespace archspace {

at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& gate_proj, const at::Tensor& up_proj,
                      const at::Tensor& down_proj, bool fp8) {
  const std::vector<at::Tensor> gate_up = (fp8 ? fp8_linear_many : linear_many)(x, {gate_proj, up_proj});
  const at::Tensor& gate = gate_up[0];
  const at::Tensor& up = gate_up[1];
  const at::Tensor hidden = fused_training_swiglu_applies(gate, up) ? fused_swiglu_trained(gate, up)
                                                                    : at::silu(gate) * up;  // train.fused_kernels
  return fp8 ? fp8_linear(hidden, down_proj) : archspace::linear(hidden, down_proj);
}

}  // namespace archspace
