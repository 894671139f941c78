#include "archspace/kernels/decode_attention.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_elements.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace archspace {

namespace {

using cpu_elements::kExpLow;
using cpu_elements::load;
using cpu_elements::store;
#if defined(__x86_64__)
using cpu_elements::exp8;
using cpu_elements::load8;
#endif

bool wants_grad(const at::Tensor& t) { return at::GradMode::is_enabled() && t.requires_grad(); }

template <typename T>
float dot_scalar(const float* q, const T* k, int64_t D) {
  float s = 0;
  for (int64_t i = 0; i < D; ++i) s += q[i] * load(k, i);
  return s;
}

template <typename T>
void axpy_scalar(float p, const T* v, float* acc, int64_t D) {
  for (int64_t i = 0; i < D; ++i) acc[i] += p * load(v, i);
}

void exp_scalar(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
}

#if defined(__x86_64__)

template <typename T>
__attribute__((target("avx2,fma"))) inline float dot_avx2(const float* q, const T* k, int64_t D) {
  __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), load8(k));
  for (int64_t i = 8; i < D; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), acc);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

__attribute__((target("avx2,fma"))) inline void exp_avx2(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp8(_mm256_loadu_ps(x + i)));
  if (i < n) {  // the tail through a padded lane buffer: the same function for every key
    alignas(32) float t[8] = {kExpLow - 1, kExpLow - 1, kExpLow - 1, kExpLow - 1,
                              kExpLow - 1, kExpLow - 1, kExpLow - 1, kExpLow - 1};
    for (int64_t j = i; j < n; ++j) t[j - i] = x[j];
    _mm256_store_ps(t, exp8(_mm256_load_ps(t)));
    for (int64_t j = i; j < n; ++j) x[j] = t[j - i];
  }
}
#endif

struct Layout {
  int64_t B, H, G, Tk, D;
  int64_t qs[3], ks[3], vs[3];  // strides of dims 0..2 (the last is contiguous)
  int64_t mask_b, mask_t;       // the mask's strides over b and keys (0 where broadcast)
};

struct Row {
  int64_t Tk, D, k_stride, v_stride, mask_stride;
  float scale;
  float* scores;  // Tk floats of scratch
  float* qf;      // D
  float* acc;     // D
};

// One (b, h): scores of the allowed keys (masked ones at -inf), max subtracted (all masked: -inf - -inf = NaN,
// as softmax gives), exp, then the weighted sum of the allowed keys' values (masked keys skipped: exactly 0,
// whatever a padding slot holds) over the sum of weights. The AVX2 form is the same loop with the vector
// helpers inlined into it.
template <typename T>
void row_scalar(const T* q, const T* k, const T* v, const bool* mask, T* out, const Row& R) {
  for (int64_t i = 0; i < R.D; ++i) R.qf[i] = load(q, i);
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < R.Tk; ++j) {
    const bool allowed = !mask || mask[j * R.mask_stride];
    R.scores[j] = allowed ? R.scale * dot_scalar(R.qf, k + j * R.k_stride, R.D) : -INFINITY;
    max = std::max(max, R.scores[j]);
  }
  for (int64_t j = 0; j < R.Tk; ++j) R.scores[j] -= max;
  exp_scalar(R.scores, R.Tk);
  float sum = 0;
  std::fill(R.acc, R.acc + R.D, 0.0f);
  for (int64_t j = 0; j < R.Tk; ++j) {
    if (mask && !mask[j * R.mask_stride]) continue;
    sum += R.scores[j];
    axpy_scalar(R.scores[j], v + j * R.v_stride, R.acc, R.D);
  }
  for (int64_t i = 0; i < R.D; ++i) store(out, i, R.acc[i] / sum);
}

#if defined(__x86_64__)
// The scores of keys j..j+3: four independent FMA chains (one chain per key would wait on each FMA's
// latency), then the four horizontal sums at once.
template <typename T>
__attribute__((target("avx2,fma"))) inline __m128 dot4_avx2(const float* q, const T* k, int64_t stride, int64_t D) {
  const T *k0 = k, *k1 = k + stride, *k2 = k1 + stride, *k3 = k2 + stride;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < D; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    a0 = _mm256_fmadd_ps(qv, load8(k0 + i), a0);
    a1 = _mm256_fmadd_ps(qv, load8(k1 + i), a1);
    a2 = _mm256_fmadd_ps(qv, load8(k2 + i), a2);
    a3 = _mm256_fmadd_ps(qv, load8(k3 + i), a3);
  }
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));  // [0 1 2 3 | 0 1 2 3] halves
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// The weighted sum of the allowed keys' values over columns [i0, i0 + 8 * V): V accumulators of 8 columns
// in registers (an accumulator in memory would chain every key's update through a store and a load), one
// FMA per accumulator per key, independent of each other; each column still sums its keys in order.
template <int V, typename T>
__attribute__((target("avx2,fma"))) inline void weighted_sum_avx2(const T* v, const bool* mask, const Row& R,
                                                                  int64_t i0) {
  __m256 a[V];
  for (int t = 0; t < V; ++t) a[t] = _mm256_setzero_ps();
  for (int64_t j = 0; j < R.Tk; ++j) {
    if (mask && !mask[j * R.mask_stride]) continue;
    const __m256 p = _mm256_set1_ps(R.scores[j]);
    const T* vj = v + j * R.v_stride + i0;
    for (int t = 0; t < V; ++t) a[t] = _mm256_fmadd_ps(p, load8(vj + 8 * t), a[t]);
  }
  for (int t = 0; t < V; ++t) _mm256_storeu_ps(R.acc + i0 + 8 * t, a[t]);
}

template <typename T>
__attribute__((target("avx2,fma"))) void row_avx2(const T* q, const T* k, const T* v, const bool* mask, T* out,
                                                  const Row& R) {
  for (int64_t i = 0; i < R.D; ++i) R.qf[i] = load(q, i);
  int64_t j = 0;
  for (; j + 4 <= R.Tk; j += 4)
    _mm_storeu_ps(R.scores + j, _mm_mul_ps(_mm_set1_ps(R.scale), dot4_avx2(R.qf, k + j * R.k_stride, R.k_stride, R.D)));
  for (; j < R.Tk; ++j) R.scores[j] = R.scale * dot_avx2(R.qf, k + j * R.k_stride, R.D);
  float max = -std::numeric_limits<float>::infinity();
  for (j = 0; j < R.Tk; ++j) {  // masked keys' scores were computed from whatever their slots hold: replaced
    if (mask && !mask[j * R.mask_stride]) R.scores[j] = -INFINITY;
    max = std::max(max, R.scores[j]);
  }
  for (j = 0; j < R.Tk; ++j) R.scores[j] -= max;
  exp_avx2(R.scores, R.Tk);
  float sum = 0;
  for (j = 0; j < R.Tk; ++j)
    if (!mask || mask[j * R.mask_stride]) sum += R.scores[j];
  int64_t i0 = 0;  // D is a multiple of 8 here
  for (; i0 + 64 <= R.D; i0 += 64) weighted_sum_avx2<8>(v, mask, R, i0);
  for (; i0 + 16 <= R.D; i0 += 16) weighted_sum_avx2<2>(v, mask, R, i0);
  if (i0 < R.D) weighted_sum_avx2<1>(v, mask, R, i0);
  for (int64_t i = 0; i < R.D; ++i) store(out, i, R.acc[i] / sum);
}
#endif

template <typename T>
void attend(const T* q, const T* k, const T* v, const bool* mask, T* out, float scale, const Layout& L, bool avx2) {
  const int64_t rows = L.B * L.H, per_group = L.H / L.G, D = L.D, Tk = L.Tk;
  // A decode step is B * H rows of Tk * D work each, and reads each row's keys and values from memory (the
  // weights streamed since the last step evicted them): a task takes rows of at least 2^14 key elements
  // (64 KB of fp32 keys and as much of values, several microseconds at one core's bandwidth), so all but the
  // shortest contexts share the rows over the threads, which wait spinning between the step's matrix
  // products. 190M int8 batch-1 decode after 128 tokens (Zen 4, 2 threads, 8 alternating runs): 115 against
  // 109 tok/s with 2^20 (one thread below ~1,000 keys).
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, Tk * D));
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch(Tk + 2 * D);  // per thread, reused for every row it takes
    const Row R{Tk, D, L.ks[2], L.vs[2], L.mask_t, scale, scratch.data(), scratch.data() + Tk, scratch.data() + Tk + D};
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / L.H, h = r % L.H, g = h / per_group;
      const T* qr = q + b * L.qs[0] + h * L.qs[1];
      const T* kr = k + b * L.ks[0] + g * L.ks[1];
      const T* vr = v + b * L.vs[0] + g * L.vs[1];
      const bool* mr = mask ? mask + b * L.mask_b : nullptr;
#if defined(__x86_64__)
      if (avx2) {
        row_avx2(qr, kr, vr, mr, out + r * D, R);
        continue;
      }
#endif
      row_scalar(qr, kr, vr, mr, out + r * D, R);
    }
  });
}

}  // namespace

bool uses_decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& padding_mask) {
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (!t->defined() || !t->device().is_cpu() || t->dim() != 4 || wants_grad(*t)) return false;
    if (t->scalar_type() != q.scalar_type() || t->stride(3) != 1) return false;
  }
  if (q.scalar_type() != at::kFloat && q.scalar_type() != at::kBFloat16) return false;
  const int64_t B = q.size(0), H = q.size(1), G = k.size(1), Tk = k.size(2), D = q.size(3);
  if (q.size(2) != 1 || B < 1 || H < 1 || G < 1 || Tk < 1 || D < 1 || H % G != 0) return false;
  if (k.size(0) != B || k.size(3) != D || v.sizes() != k.sizes()) return false;
  if (!padding_mask.defined()) return true;
  if (!padding_mask.device().is_cpu() || padding_mask.scalar_type() != at::kBool || padding_mask.dim() > 4)
    return false;
  const int64_t target[4] = {B, 1, 1, Tk};
  for (int64_t i = 1; i <= padding_mask.dim(); ++i) {
    const int64_t n = padding_mask.size(-i);
    if (n != 1 && n != target[4 - i]) return false;
  }
  return true;
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                            const at::Tensor& padding_mask, CpuIsa isa) {
  TORCH_CHECK(uses_decode_attention(q, k, v, padding_mask), "decode_attention: unsupported arguments");
  RECORD_FUNCTION("archspace::decode_attention", c10::ArrayRef<const c10::IValue>{});  // a span in --profile
  Layout L{q.size(0), q.size(1), k.size(1), k.size(2), q.size(3), {}, {}, {}, 0, 0};
  for (int i = 0; i < 3; ++i) L.qs[i] = q.stride(i), L.ks[i] = k.stride(i), L.vs[i] = v.stride(i);
  at::Tensor mask;
  if (padding_mask.defined()) {
    mask = padding_mask.expand({L.B, 1, 1, L.Tk});  // a view: broadcast dims get stride 0
    L.mask_b = mask.stride(0);
    L.mask_t = mask.stride(3);
  }
  const bool* mp = mask.defined() ? mask.const_data_ptr<bool>() : nullptr;
  const bool avx2 = kernel_isa(isa) >= CpuIsa::kAvx2 && L.D % 8 == 0;
  at::Tensor out = at::empty({L.B, L.H, 1, L.D}, q.options().memory_format(at::MemoryFormat::Contiguous));
  const float s = static_cast<float>(scale);
  if (q.scalar_type() == at::kFloat)
    attend(q.const_data_ptr<float>(), k.const_data_ptr<float>(), v.const_data_ptr<float>(), mp,
           out.mutable_data_ptr<float>(), s, L, avx2);
  else
    attend(q.const_data_ptr<at::BFloat16>(), k.const_data_ptr<at::BFloat16>(), v.const_data_ptr<at::BFloat16>(), mp,
           out.mutable_data_ptr<at::BFloat16>(), s, L, avx2);
  return out;
}

void decode_attention_exp(float* x, int64_t n, CpuIsa isa) {
#if defined(__x86_64__)
  if (kernel_isa(isa) >= CpuIsa::kAvx2) return exp_avx2(x, n);
#endif
  (void)isa;
  exp_scalar(x, n);
}

}  // namespace archspace
