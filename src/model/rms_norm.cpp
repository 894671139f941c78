#include "archspace/model/rms_norm.h"

#include "archspace/kernels/fused_norm_rope.h"
#include "archspace/kernels/fused_training.h"

namespace archspace {

at::ScalarType compute_dtype(const at::Tensor& x) { return at::promote_types(x.scalar_type(), at::kFloat); }

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (uses_fused_rms_norm(x, weight)) return fused_rms_norm(x, weight, eps);  // inference on the CPU: one pass
  if (fused_training_norm_applies(x, weight)) return fused_rms_norm_trained(x, weight, eps);  // train.fused_kernels
  at::Tensor xf = x.to(compute_dtype(x));
  at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor normed = xf * at::rsqrt(variance + eps);
  return (weight * normed).to(x.scalar_type());
}

at::Tensor add_rms_norm(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (uses_fused_add_rms_norm(residual, x, weight)) return fused_add_rms_norm(residual, x, weight, eps);
  if (fused_training_add_norm_applies(residual, x, weight)) return fused_add_rms_norm_trained(residual, x, weight, eps);
  return residual + rms_norm(x, weight, eps);
}

}  // namespace archspace
