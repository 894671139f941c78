#include "archspace/model/rms_norm.h"

#include "archspace/kernels/fused_norm_rope.h"
#include "archspace/kernels/fused_training.h"

namespace archspace {

at::ScalarType compute_dtype(const at::Tensor& x) { return at::promote_types(x.scalar_type(), at::kFloat); }

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, KernelChoices kernels) {
  switch (rms_norm_kernel(x, weight, kernels)) {
    case Kernel::kFusedInference:  // inference on the CPU: one pass
      return fused_rms_norm(x, weight, eps);
    case Kernel::kFusedTrainingCpu:
    case Kernel::kFusedTrainingCuda:  // train.fused_kernels
      return fused_rms_norm_trained(x, weight, eps);
    default:
      break;
  }
  at::Tensor xf = x.to(compute_dtype(x));
  at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor normed = xf * at::rsqrt(variance + eps);
  return (weight * normed).to(x.scalar_type());
}

at::Tensor add_rms_norm(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps,
                        KernelChoices kernels) {
  switch (add_rms_norm_kernel(residual, x, weight, kernels)) {
    case Kernel::kFusedInference:
      return fused_add_rms_norm(residual, x, weight, eps);
    case Kernel::kFusedTrainingCpu:
    case Kernel::kFusedTrainingCuda:
      return fused_add_rms_norm_trained(residual, x, weight, eps);
    default:
      return residual + rms_norm(x, weight, eps, kernels);
  }
}

}  // namespace archspace
