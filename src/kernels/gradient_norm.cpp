#include "archspace/kernels/gradient_norm.h"

#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <string>
#include <vector>

#include "archspace/kernels/cpu_isa.h"
#include "archspace/util/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace archspace {

namespace {

constexpr int kLanes = 16;

// The fixed tree over the 16 accumulators: lane i with lane i + 8, then i + 4, i + 2, i + 1 (what the AVX2
// kernel's register halves add to).
double combine(double a[kLanes]) {
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int i = 0; i < width; ++i) a[i] += a[i + width];
  return a[0];
}

double row_squares_scalar(const float* x, int64_t n) {
  double a[kLanes] = {};
  for (int64_t j = 0; j < n; ++j) {
    const double v = x[j];
    a[j % kLanes] += v * v;
  }
  return combine(a);
}

#if defined(__x86_64__)
// Lanes 0-3, 4-7, 8-11 and 12-15 in four fp64 registers. v * v is exact in fp64, so the fused multiply-add
// rounds once, as the scalar kernel's add does.
__attribute__((target("avx2,fma"))) double row_squares_avx2(const float* x, int64_t n) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int q = 0; q < 4; ++q) {
      const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + j + 4 * q));
      acc[q] = _mm256_fmadd_pd(v, v, acc[q]);
    }
  }
  alignas(32) double a[kLanes];
  for (int q = 0; q < 4; ++q) _mm256_store_pd(a + 4 * q, acc[q]);
  for (; j < n; ++j) {
    const double v = x[j];
    a[j % kLanes] += v * v;  // j - (the vector part's length) has the same residue: it is a multiple of 16
  }
  return combine(a);
}
#endif

using RowKernel = double (*)(const float*, int64_t);

RowKernel row_kernel(CpuIsa isa) {
#if defined(__x86_64__)
  if (kernel_isa(isa) >= CpuIsa::kAvx2) return row_squares_avx2;
#endif
  return row_squares_scalar;
}

// Rows of a contiguous tensor: its last dimension, or kFlatRow-element chunks of a 1-D one (the last may be
// shorter).
int64_t row_length(const at::Tensor& t) {
  if (t.dim() >= 2) return t.size(-1);
  return std::min<int64_t>(std::max<int64_t>(t.numel(), 1), kFlatRow);
}

void check_rows(const at::Tensor& rows, int64_t num_rows, const char* what) {
  if (rows.scalar_type() != at::kLong || rows.dim() != 1 || !rows.device().is_cpu())
    throw Error(std::string(what) + ": nonzero_rows must be a 1-D int64 CPU tensor");
  const int64_t* r = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows.numel(); ++i)
    if (r[i] < 0 || r[i] >= num_rows || (i > 0 && r[i] <= r[i - 1]))
      throw Error(std::string(what) + ": nonzero_rows must be sorted, distinct rows below " + std::to_string(num_rows));
}

}  // namespace

at::Tensor sum_of_squares(const at::Tensor& t, const at::Tensor& nonzero_rows) {
  c10::NoGradGuard no_grad;
  const at::TensorOptions f64 = at::TensorOptions(at::kDouble).device(t.device());
  if (t.numel() == 0) return at::zeros({}, f64);
  const int64_t R = row_length(t), num_rows = (t.numel() + R - 1) / R;
  if (!t.device().is_cpu() || t.scalar_type() != at::kFloat) {  // ATen's own order (not the one above)
    if (!nonzero_rows.defined() || t.numel() % R != 0) return t.to(at::kDouble).square().sum();
    return t.reshape({num_rows, R}).index_select(0, nonzero_rows.to(t.device())).to(at::kDouble).square().sum();
  }
  const at::Tensor c = t.contiguous();
  const float* x = c.data_ptr<float>();
  const int64_t numel = c.numel();
  const RowKernel kernel = row_kernel(max_cpu_isa());
  const int64_t* rows = nullptr;
  int64_t count = num_rows;
  if (nonzero_rows.defined()) {
    check_rows(nonzero_rows, num_rows, "sum_of_squares");
    rows = nonzero_rows.data_ptr<int64_t>();
    count = nonzero_rows.numel();
  }
  std::vector<double> sums(static_cast<size_t>(count));
  at::parallel_for(0, count, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = rows ? rows[i] : i;
      sums[static_cast<size_t>(i)] = kernel(x + row * R, std::min(R, numel - row * R));
    }
  });
  double total = 0.0;
  for (double s : sums) total += s;  // row order, whichever threads formed the rows
  return at::scalar_tensor(total, f64);
}

void scale_gradient(at::Tensor& t, float coef, const at::Tensor& nonzero_rows) {
  c10::NoGradGuard no_grad;
  if (coef == 1.0f || t.numel() == 0) return;  // x * 1 = x
  if (!nonzero_rows.defined()) {
    t.mul_(at::scalar_tensor(coef, at::TensorOptions(at::kFloat).device(t.device())));
    return;
  }
  const int64_t R = row_length(t), num_rows = (t.numel() + R - 1) / R;
  if (!t.is_contiguous() || t.numel() % R != 0) {  // all of it: the other rows' zeros stay zeros
    t.mul_(at::scalar_tensor(coef, at::TensorOptions(at::kFloat).device(t.device())));
    return;
  }
  if (!t.device().is_cpu() || t.scalar_type() != at::kFloat) {
    const at::Tensor rows = nonzero_rows.to(t.device());
    at::Tensor view = t.view({num_rows, R});
    view.index_copy_(0, rows, view.index_select(0, rows).mul_(coef));
    return;
  }
  check_rows(nonzero_rows, num_rows, "scale_gradient");
  float* x = t.data_ptr<float>();
  const int64_t* rows = nonzero_rows.data_ptr<int64_t>();
  const int64_t numel = t.numel();
  at::parallel_for(0, nonzero_rows.numel(), 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* row = x + rows[i] * R;
      const int64_t n = std::min(R, numel - rows[i] * R);
      for (int64_t j = 0; j < n; ++j) row[j] *= coef;
    }
  });
}

double row_sum_of_squares(const float* x, int64_t n, CpuIsa isa) { return row_kernel(isa)(x, n); }

float clip_coefficient(float total_norm, double max_norm) {
  const at::Tensor total = at::scalar_tensor(total_norm, at::kFloat);
  return at::clamp_max(max_norm / (total + 1e-6), 1.0).item<float>();
}

}  // namespace archspace
