#include "archspace/kernels/cross_entropy_rows.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "archspace/util/error.h"
#include "archspace/util/tensors.h"
#include "cpu_elements.h"

namespace archspace {

namespace {

using cpu_elements::load;
using cpu_elements::store;

// Sums of exp go into fp64 a block at a time: within a block each fp32 accumulator adds at most 32 terms
// (relative error below 32 * 2^-24: the 8 lanes of an AVX2 block of 256, or one scalar sum of 32), and the
// blocks' sums add in fp64.
constexpr int64_t kBlock = 256, kScalarBlock = 32;

template <typename T>
float row_max_scalar(const T* x, int64_t V) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < V; ++j) m = std::max(m, load(x, j));
  return m;
}

template <typename T>
double row_sum_exp_scalar(const T* x, int64_t V, float shift) {
  double total = 0;
  for (int64_t b = 0; b < V; b += kScalarBlock) {
    float s = 0;
    for (int64_t j = b; j < std::min(V, b + kScalarBlock); ++j) s += std::exp(load(x, j) - shift);
    total += s;
  }
  return total;
}

template <typename T>
void row_grad_scalar(T* x, int64_t V, float lse, float scale) {
  for (int64_t j = 0; j < V; ++j) store(x, j, std::exp(load(x, j) - lse) * scale);
}

#if defined(__x86_64__)
using cpu_elements::exp8;
using cpu_elements::load8;
using cpu_elements::store8;

__attribute__((target("avx2,fma"))) inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

__attribute__((target("avx2,fma"))) inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <typename T>
__attribute__((target("avx2,fma"))) float row_max_avx2(const T* x, int64_t V) {
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  // NaN propagates: max_ps returns its second operand when either is NaN.
  for (; j + 8 <= V; j += 8) m = _mm256_max_ps(m, load8(x + j));
  float r = hmax8(m);
  for (; j < V; ++j) r = std::max(r, load(x, j));
  return r;
}

template <typename T>
__attribute__((target("avx2,fma"))) double row_sum_exp_avx2(const T* x, int64_t V, float shift) {
  const __m256 s8 = _mm256_set1_ps(shift);
  double total = 0;
  int64_t j = 0;
  while (j + 8 <= V) {
    __m256 acc = _mm256_setzero_ps();
    const int64_t end = std::min(V - 7, j + kBlock);
    for (; j < end; j += 8) acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(load8(x + j), s8)));
    total += hsum8(acc);
  }
  if (j < V) {  // the tail through a padded lane buffer: the same exp for every element
    alignas(32) float t[8];
    for (int k = 0; k < 8; ++k) t[k] = j + k < V ? load(x, j + k) - shift : -std::numeric_limits<float>::infinity();
    total += hsum8(exp8(_mm256_load_ps(t)));
  }
  return total;
}

template <typename T>
__attribute__((target("avx2,fma"))) void row_grad_avx2(T* x, int64_t V, float lse, float scale) {
  const __m256 l8 = _mm256_set1_ps(lse), c8 = _mm256_set1_ps(scale);
  int64_t j = 0;
  for (; j + 8 <= V; j += 8) store8(x + j, _mm256_mul_ps(exp8(_mm256_sub_ps(load8(x + j), l8)), c8));
  if (j < V) {
    alignas(32) float t[8] = {};
    for (int64_t k = j; k < V; ++k) t[k - j] = load(x, k);
    _mm256_store_ps(t, _mm256_mul_ps(exp8(_mm256_sub_ps(_mm256_load_ps(t), l8)), c8));
    for (int64_t k = j; k < V; ++k) store(x, k, t[k - j]);
  }
}
#endif

bool use_avx2(CpuIsa isa) {
#if defined(__x86_64__)
  return kernel_isa(isa) >= CpuIsa::kAvx2;
#else
  (void)isa;
  return false;
#endif
}

// One thread takes whole rows; a row of the head's logits (100,278 ids) is 200-400 kB of work.
int64_t row_grain(int64_t V) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(V, 1)); }

void check(const at::Tensor& logits, const at::Tensor& targets, const char* what) {
  if (!cross_entropy_rows_supported(logits))
    throw Error(std::string(what) + ": logits must be a CPU fp32 or bf16 [n, V] tensor with contiguous rows, got " +
                c10::toString(logits.scalar_type()) + " " + shape_string(logits.sizes().vec()) + " on " +
                logits.device().str());
  if (targets.scalar_type() != at::kLong || targets.dim() != 1 || targets.size(0) != logits.size(0) ||
      !targets.device().is_cpu())
    throw Error(std::string(what) + ": targets must be a CPU int64 [" + std::to_string(logits.size(0)) + "] tensor");
}

template <typename T>
void forward_rows(const at::Tensor& logits, const int64_t* t, float* lse, float* picked, bool avx2) {
  const int64_t n = logits.size(0), V = logits.size(1), stride = logits.stride(0);
  const T* base = logits.const_data_ptr<T>();
  at::parallel_for(0, n, row_grain(V), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* x = base + i * stride;
      if (t[i] < 0 || t[i] >= V)
        throw Error("cross_entropy_rows: target " + std::to_string(t[i]) + " of row " + std::to_string(i) +
                    " is outside [0, " + std::to_string(V) + ")");
      float m;
      double s;
#if defined(__x86_64__)
      if (avx2) {
        m = row_max_avx2(x, V);
        s = row_sum_exp_avx2(x, V, m);
      } else
#endif
      {
        m = row_max_scalar(x, V);
        s = row_sum_exp_scalar(x, V, m);
      }
      lse[i] = static_cast<float>(static_cast<double>(m) + std::log(s));
      picked[i] = load(x, t[i]);
    }
  });
}

template <typename T>
void backward_rows(at::Tensor& logits, const int64_t* t, const float* lse, float g_ce, float g_z2, bool avx2) {
  const int64_t n = logits.size(0), V = logits.size(1), stride = logits.stride(0);
  T* base = logits.mutable_data_ptr<T>();
  at::parallel_for(0, n, row_grain(V), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T* x = base + i * stride;
      const float scale = g_ce + g_z2 * lse[i];
      // The label's logit before the row is overwritten: its gradient has -g_ce more, rounded once.
      const float at_label = std::exp(load(x, t[i]) - lse[i]) * scale - g_ce;
#if defined(__x86_64__)
      if (avx2)
        row_grad_avx2(x, V, lse[i], scale);
      else
#endif
        row_grad_scalar(x, V, lse[i], scale);
      store(x, t[i], at_label);
    }
  });
}

}  // namespace

bool cross_entropy_rows_supported(const at::Tensor& logits) {
  return logits.device().is_cpu() && logits.dim() == 2 &&
         (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16) &&
         (logits.size(1) <= 1 || logits.stride(1) == 1);
}

RowLogSumExp cross_entropy_rows(const at::Tensor& logits, const at::Tensor& targets, CpuIsa isa) {
  check(logits, targets, "cross_entropy_rows");
  const int64_t n = logits.size(0);
  RowLogSumExp out{at::empty({n}, at::kFloat), at::empty({n}, at::kFloat)};
  const at::Tensor t = targets.contiguous();
  const bool avx2 = use_avx2(isa);
  if (logits.scalar_type() == at::kFloat)
    forward_rows<float>(logits, t.const_data_ptr<int64_t>(), out.lse.mutable_data_ptr<float>(),
                        out.picked.mutable_data_ptr<float>(), avx2);
  else
    forward_rows<at::BFloat16>(logits, t.const_data_ptr<int64_t>(), out.lse.mutable_data_ptr<float>(),
                               out.picked.mutable_data_ptr<float>(), avx2);
  return out;
}

void cross_entropy_grad_rows_(at::Tensor& logits, const at::Tensor& targets, const at::Tensor& lse, float g_ce,
                              float g_z2, CpuIsa isa) {
  check(logits, targets, "cross_entropy_grad_rows_");
  if (lse.scalar_type() != at::kFloat || lse.dim() != 1 || lse.size(0) != logits.size(0) || !lse.device().is_cpu())
    throw Error("cross_entropy_grad_rows_: lse must be a CPU fp32 [" + std::to_string(logits.size(0)) + "] tensor");
  const at::Tensor t = targets.contiguous(), l = lse.contiguous();
  const bool avx2 = use_avx2(isa);
  if (logits.scalar_type() == at::kFloat)
    backward_rows<float>(logits, t.const_data_ptr<int64_t>(), l.const_data_ptr<float>(), g_ce, g_z2, avx2);
  else
    backward_rows<at::BFloat16>(logits, t.const_data_ptr<int64_t>(), l.const_data_ptr<float>(), g_ce, g_z2, avx2);
}

}  // namespace archspace
