#include "archspace/model/mlp.h"

#include "archspace/kernels/linear.h"

namespace archspace {

at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& gate_proj, const at::Tensor& up_proj,
                      const at::Tensor& down_proj) {
  const std::vector<at::Tensor> gate_up = linear_many(x, {gate_proj, up_proj});
  return archspace::linear(at::silu(gate_up[0]) * gate_up[1], down_proj);
}

}  // namespace archspace
