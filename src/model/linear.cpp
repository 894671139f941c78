#include "archspace/model/linear.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "archspace/util/cpu_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace archspace {

namespace {

// Rows [n0, n1) of y[m, n] = sum_k W[n, k] x[m, k] for all M rows of x. Four weight rows at a time, so
// four independent FMA chains hide latency; the 4 x K block is reused from L1 for every row of x.
void dot_rows_scalar(const float* W, const float* x, float* y, int64_t M, int64_t N, int64_t K, int64_t n0,
                     int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const float* w = W + n * K;
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += w[k] * x[m * K + k];
      y[m * N + n] = acc;
    }
  }
}

#if defined(__x86_64__)
// The eight sums of a0..a7's lanes, in that order, in one vector: three rounds of pairwise adds instead of
// eight separate horizontal sums (which cost as much as the FMAs when K is small).
__attribute__((target("avx2,fma"))) inline __m256 horizontal_sums8(__m256 a0, __m256 a1, __m256 a2, __m256 a3,
                                                                   __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

__attribute__((target("avx2,fma"))) void dot_rows_avx2(const float* W, const float* x, float* y, int64_t M, int64_t N,
                                                       int64_t K, int64_t n0, int64_t n1) {
  const int64_t K8 = K - K % 8;
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    const float* w0 = W + n * K;
    const float* w1 = w0 + K;
    const float* w2 = w1 + K;
    const float* w3 = w2 + K;
    int64_t m = 0;
    // Two rows of x at a time: each weight load feeds two FMAs.
    for (; m + 2 <= M; m += 2) {
      const float* xa = x + m * K;
      const float* xb = xa + K;
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
      __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
      for (int64_t k = 0; k < K8; k += 8) {
        const __m256 xav = _mm256_loadu_ps(xa + k), xbv = _mm256_loadu_ps(xb + k);
        const __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
        a0 = _mm256_fmadd_ps(v0, xav, a0);
        b0 = _mm256_fmadd_ps(v0, xbv, b0);
        a1 = _mm256_fmadd_ps(v1, xav, a1);
        b1 = _mm256_fmadd_ps(v1, xbv, b1);
        const __m256 v2 = _mm256_loadu_ps(w2 + k), v3 = _mm256_loadu_ps(w3 + k);
        a2 = _mm256_fmadd_ps(v2, xav, a2);
        b2 = _mm256_fmadd_ps(v2, xbv, b2);
        a3 = _mm256_fmadd_ps(v3, xav, a3);
        b3 = _mm256_fmadd_ps(v3, xbv, b3);
      }
      alignas(32) float s[8];  // rows n..n+3 for x row m, then for x row m + 1
      _mm256_store_ps(s, horizontal_sums8(a0, a1, a2, a3, b0, b1, b2, b3));
      for (int64_t k = K8; k < K; ++k) {
        s[0] += w0[k] * xa[k];
        s[1] += w1[k] * xa[k];
        s[2] += w2[k] * xa[k];
        s[3] += w3[k] * xa[k];
        s[4] += w0[k] * xb[k];
        s[5] += w1[k] * xb[k];
        s[6] += w2[k] * xb[k];
        s[7] += w3[k] * xb[k];
      }
      std::copy(s, s + 4, y + m * N + n);
      std::copy(s + 4, s + 8, y + (m + 1) * N + n);
    }
    for (; m < M; ++m) {  // the last odd row: the same sums in the same order, so a row's result does not
                          // depend on its batch
      const float* xm = x + m * K;
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
      for (int64_t k = 0; k < K8; k += 8) {
        const __m256 xv = _mm256_loadu_ps(xm + k);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), xv, a3);
      }
      alignas(32) float s[8];
      _mm256_store_ps(s, horizontal_sums8(a0, a1, a2, a3, a0, a1, a2, a3));
      for (int64_t k = K8; k < K; ++k) {
        s[0] += w0[k] * xm[k];
        s[1] += w1[k] * xm[k];
        s[2] += w2[k] * xm[k];
        s[3] += w3[k] * xm[k];
      }
      std::copy(s, s + 4, y + m * N + n);
    }
  }
  dot_rows_scalar(W, x, y, M, N, K, n, n1);
}

bool cpu_has_avx2_fma() { return max_cpu_isa() >= CpuIsa::kAvx2; }
#endif

}  // namespace

bool uses_streaming_linear(const at::Tensor& x, const at::Tensor& weight) {
#if defined(__x86_64__)
  if (!cpu_has_avx2_fma()) return false;
#else
  return false;
#endif
  if (!x.device().is_cpu() || !weight.device().is_cpu()) return false;
  if (x.scalar_type() != at::kFloat || weight.scalar_type() != at::kFloat) return false;
  if (weight.dim() != 2 || !weight.is_contiguous() || x.size(-1) != weight.size(1)) return false;
  // The kernel has no backward: anything autograd must see goes through at::linear.
  if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) return false;
  return x.numel() / std::max<int64_t>(1, x.size(-1)) <= kStreamingLinearMaxRows;
}

at::Tensor streaming_linear(const at::Tensor& x, const at::Tensor& weight) {
  const int64_t K = weight.size(1), N = weight.size(0);
  at::Tensor xc = x.contiguous();
  const int64_t M = xc.numel() / K;
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = N;
  at::Tensor y = at::empty({M, N}, x.options());
  const float* W = weight.const_data_ptr<float>();
  const float* xp = xc.const_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  // Split the output features over threads in blocks of four rows; 256 rows per task at least so that
  // small matrices do not pay for waking threads.
  const int64_t blocks = (N + 3) / 4;
  at::parallel_for(0, blocks, 64, [&](int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * 4, n1 = std::min(N, b1 * 4);
#if defined(__x86_64__)
    if (cpu_has_avx2_fma()) {
      dot_rows_avx2(W, xp, yp, M, N, K, n0, n1);
      return;
    }
#endif
    dot_rows_scalar(W, xp, yp, M, N, K, n0, n1);
  });
  return y.view(out_shape);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight) {
  if (uses_streaming_linear(x, weight)) return streaming_linear(x, weight);
  return at::linear(x, weight);
}

}  // namespace archspace
