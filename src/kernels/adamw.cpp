#include "archspace/kernels/adamw.h"

#include <ATen/Parallel.h>

#include <cmath>

#include "archspace/util/error.h"
#include "cpu_elements.h"

namespace archspace {

namespace {

using cpu_elements::store;

// Elements per task of at::parallel_for: large enough that a thread streams memory, not schedules.
constexpr int64_t kGrain = 1 << 15;

void update_scalar(float* p, const float* g, float* m, float* v, at::BFloat16* low, int64_t n, const AdamWScalars& s) {
  for (int64_t i = 0; i < n; ++i) {
    const float grad = g[i] * s.grad_scale;
    const float mi = std::fma(s.lerp_coefficient, grad - m[i], s.lerp_from_grad ? grad : m[i]);
    const float vi = std::fma(s.one_minus_beta2 * grad, grad, v[i] * s.beta2);
    const float denom = std::sqrt(vi) / s.bias_correction2_sqrt + s.eps;
    const float pi = p[i] * s.decay + s.neg_step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (low) store(low, i, pi);
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void update_avx2(float* p, const float* g, float* m, float* v, at::BFloat16* low,
                                                     int64_t n, const AdamWScalars& s) {
  const __m256 grad_scale = _mm256_set1_ps(s.grad_scale), decay = _mm256_set1_ps(s.decay);
  const __m256 lerp = _mm256_set1_ps(s.lerp_coefficient), beta2 = _mm256_set1_ps(s.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(s.one_minus_beta2), neg_step = _mm256_set1_ps(s.neg_step_size);
  const __m256 bc2 = _mm256_set1_ps(s.bias_correction2_sqrt), eps = _mm256_set1_ps(s.eps);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 grad = _mm256_mul_ps(_mm256_loadu_ps(g + i), grad_scale);
    const __m256 m0 = _mm256_loadu_ps(m + i);
    const __m256 mi = _mm256_fmadd_ps(lerp, _mm256_sub_ps(grad, m0), s.lerp_from_grad ? grad : m0);
    const __m256 vi =
        _mm256_fmadd_ps(_mm256_mul_ps(one_minus_beta2, grad), grad, _mm256_mul_ps(_mm256_loadu_ps(v + i), beta2));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
    const __m256 pi =
        _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(p + i), decay), _mm256_div_ps(_mm256_mul_ps(neg_step, mi), denom));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, pi);
    if (low) cpu_elements::store8(low + i, pi);
  }
  update_scalar(p + i, g + i, m + i, v + i, low ? low + i : nullptr, n - i, s);
}
#endif

using UpdateKernel = void (*)(float*, const float*, float*, float*, at::BFloat16*, int64_t, const AdamWScalars&);

UpdateKernel update_kernel(CpuIsa isa) {
#if defined(__x86_64__)
  if (kernel_isa(isa) >= CpuIsa::kAvx2) return update_avx2;
#endif
  return update_scalar;
}

}  // namespace

AdamWScalars adamw_scalars(double lr, double weight_decay, double beta1, double beta2, double eps, int64_t step,
                           float grad_scale) {
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  AdamWScalars s;
  s.grad_scale = grad_scale;
  s.decay = static_cast<float>(1 - lr * weight_decay);
  // ATen's lerp with weight w = 1 - beta1: m + w (g - m) for w < 0.5, else g + (w - 1)(g - m), one fma each.
  const float weight = static_cast<float>(1 - beta1);
  s.lerp_from_grad = !(std::abs(weight) < 0.5f);
  s.lerp_coefficient = s.lerp_from_grad ? weight - 1 : weight;
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(eps);
  return s;
}

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, at::BFloat16* low_precision,
                  int64_t n, const AdamWScalars& s, CpuIsa isa) {
  const UpdateKernel kernel = update_kernel(isa);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    kernel(param + begin, grad + begin, exp_avg + begin, exp_avg_sq + begin,
           low_precision ? low_precision + begin : nullptr, end - begin, s);
  });
}

bool adamw_kernel_applies(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& low_precision) {
  const auto fp32_cpu = [&](const at::Tensor& t) {
    return t.defined() && t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
           t.sizes() == param.sizes();
  };
  return fp32_cpu(param) && fp32_cpu(grad) &&
         (!low_precision.defined() || (low_precision.is_cpu() && low_precision.scalar_type() == at::kBFloat16 &&
                                       low_precision.is_contiguous() && low_precision.sizes() == param.sizes()));
}

void adamw_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                  const at::Tensor& exp_avg_sq, const at::Tensor& low_precision, const AdamWScalars& s, CpuIsa isa) {
  if (!adamw_kernel_applies(param, grad, low_precision) || !adamw_kernel_applies(param, exp_avg, {}) ||
      !adamw_kernel_applies(param, exp_avg_sq, {}))
    throw Error(
        "adamw_update: the parameter, its gradient and moments must be contiguous fp32 CPU tensors of one "
        "shape, the copy bf16 of that shape");
  adamw_update(param.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(),
               low_precision.defined() ? low_precision.data_ptr<at::BFloat16>() : nullptr, param.numel(), s, isa);
}

}  // namespace archspace
