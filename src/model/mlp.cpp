#include "archspace/model/mlp.h"

#include "archspace/kernels/fused_training.h"
#include "archspace/kernels/linear.h"

namespace archspace {

at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& gate_proj, const at::Tensor& up_proj,
                      const at::Tensor& down_proj, KernelChoices kernels) {
  const std::vector<at::Tensor> gate_up = linear_many(x, {gate_proj, up_proj}, kernels);
  const at::Tensor& gate = gate_up[0];
  const at::Tensor& up = gate_up[1];
  const Kernel product = swiglu_kernel(gate, up, kernels);
  const bool fused = product == Kernel::kFusedTrainingCpu || product == Kernel::kFusedTrainingCuda;
  const at::Tensor hidden = fused ? fused_swiglu_trained(gate, up) : at::silu(gate) * up;
  return archspace::linear(hidden, down_proj, kernels);
}

}  // namespace archspace
