#include "archspace/kernels/argmax.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "archspace/kernels/cpu_isa.h"
#include "archspace/util/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace archspace {

namespace {

int64_t argmax_scalar(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > x[best]) best = i;
  }
  return best;
}

#if defined(__x86_64__)
// Two passes over a row that stays in L2: the maximum (and whether there is a NaN), then its first index.
__attribute__((target("avx2,fma"))) int64_t argmax_avx2(const float* x, int64_t n) {
  const int64_t n8 = n - n % 8;
  __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 nan = _mm256_setzero_ps();
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    vmax = _mm256_max_ps(vmax, v);
  }
  if (_mm256_movemask_ps(nan) != 0) return argmax_scalar(x, n);  // argmax_scalar returns the first NaN
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float m = lanes[0];
  for (int j = 1; j < 8; ++j) m = std::max(m, lanes[j]);
  for (int64_t i = n8; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    m = std::max(m, x[i]);
  }
  const __m256 target = _mm256_set1_ps(m);
  for (int64_t i = 0; i < n8; i += 8) {
    const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), target, _CMP_EQ_OQ));
    if (hits != 0) return i + __builtin_ctz(static_cast<unsigned>(hits));
  }
  for (int64_t i = n8; i < n; ++i) {
    if (x[i] == m) return i;
  }
  return 0;  // unreachable: m is one of the values
}
#endif

}  // namespace

int64_t argmax_first(const float* x, int64_t n) {
  if (n < 1) throw Error("argmax of an empty row");
#if defined(__x86_64__)
  if (kernel_isa() >= CpuIsa::kAvx2) return argmax_avx2(x, n);
#endif
  return argmax_scalar(x, n);
}

int64_t argmax_index(const at::Tensor& logits) {
  if (logits.dim() == 1 && logits.device().is_cpu() && logits.scalar_type() == at::kFloat && logits.is_contiguous() &&
      logits.numel() > 0) {
    return argmax_first(logits.const_data_ptr<float>(), logits.numel());
  }
  return logits.argmax().item<int64_t>();
}

at::Tensor logits_to_float(const at::Tensor& logits) {
  if (logits.scalar_type() != at::kBFloat16 || !logits.device().is_cpu() || !logits.is_contiguous() ||
      logits.requires_grad())
    return logits.to(at::kCPU, at::kFloat);
  at::Tensor out = at::empty(logits.sizes(), logits.options().dtype(at::kFloat));
  const auto* in = reinterpret_cast<const uint16_t*>(logits.const_data_ptr<at::BFloat16>());
  float* o = out.mutable_data_ptr<float>();
  for (int64_t i = 0, n = logits.numel(); i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(o + i, &bits, sizeof bits);
  }
  return out;
}

}  // namespace archspace
