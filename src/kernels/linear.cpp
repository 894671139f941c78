#include "archspace/kernels/linear.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>

#include <algorithm>

#include "archspace/kernels/bf16_matmuls.h"
#include "archspace/kernels/cpu_isa.h"
#include "archspace/kernels/fp8_linear.h"
#include "archspace/kernels/int8_weights.h"
#include "streaming_gemv.h"
#include "streaming_gemv_bf16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace archspace {

using namespace streaming_gemv;  // the prefetch, sums, thread split and scalar/AVX2 kernels shared with int8's

namespace {

// bf16 weights and activations, fp32 sums, the result rounded to bf16 once (as at::linear's bf16 GEMM does).
// The product of two bf16 values is exact in fp32. The scalar and AVX2 kernels (streaming_gemv.h, shared with
// fp32 and int8 weights) widen x once per call (a few rows: the weights are the bytes that count) and each
// weight as they read it; `rounded_to_bf16` is how they store a bf16 result, `stored` an fp32 one.
inline auto rounded_to_bf16(c10::BFloat16* y, int64_t N) {
  return [y, N](int64_t m, int64_t n, float sum) { y[m * N + n] = c10::BFloat16(sum); };
}

inline auto stored(float* y, int64_t N) {
  return [y, N](int64_t m, int64_t n, float sum) { y[m * N + n] = sum; };
}

#if defined(__x86_64__)
// AVX512-BF16: streaming_gemv_bf16.h's vdpbf16ps kernel (shared with int8 weights); x stays bf16.
// GCC 12's AVX512 cast and extract intrinsics start from _mm256_undefined_*(), which -Wmaybe-uninitialized
// reports as (maybe) uninitialised (a false positive: every lane is written).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define ARCHSPACE_AVX512_BF16 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512bf16")))

// fp32 with AVX512F: four weight rows against four rows of x, 16 accumulators of 16 lanes, so each weight load
// feeds four FMAs and each x load four (AVX2's 16 registers hold only 4 x 2), and the horizontal sums cost a
// quarter of AVX2's per output. bench_linear at 8 rows (Zen 5, 2 threads): the micro preset's head [100278 x 64]
// 43 GB/s against 21, the 190M preset's projections 2x. The K tail is one masked load of zeros, which add nothing.
ARCHSPACE_AVX512_BF16 inline __m512 load_fp32x16(const float* p, __mmask16 lanes) {
  return _mm512_maskz_loadu_ps(lanes, p);
}

// The sums of a, b, c and d's lanes, in that order: three rounds of pairwise adds across the four vectors,
// then two horizontal adds within 128-bit lanes.
ARCHSPACE_AVX512_BF16 inline __m128 horizontal_sums4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  // 128-bit quarters: a's four partial sums, b's, c's, d's
  const __m512 abcd = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  const __m256 lo = _mm512_castps512_ps256(abcd);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1));
  __m256 h = _mm256_hadd_ps(lo, hi);                                               // [a a c c | b b d d] (pairs)
  h = _mm256_hadd_ps(h, h);                                                        // [a c a c | b d b d]
  return _mm_unpacklo_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));  // [a b c d]
}

// Weight rows w0..w3 against R rows of x (y's rows N apart). Every (x row, weight row) pair has its own
// accumulator and the same steps whatever R is, so a row's sums do not depend on the rows beside it. The
// accumulators are named scalars, not an array: GCC 12 kept an array of 16 vectors on the stack.
#define ARCHSPACE_DOT_STEP(r, lanes)                      \
  {                                                       \
    const __m512 xv = load_fp32x16(x + (r)*K + k, lanes); \
    a##r##0 = _mm512_fmadd_ps(v0, xv, a##r##0);           \
    a##r##1 = _mm512_fmadd_ps(v1, xv, a##r##1);           \
    a##r##2 = _mm512_fmadd_ps(v2, xv, a##r##2);           \
    a##r##3 = _mm512_fmadd_ps(v3, xv, a##r##3);           \
  }
#define ARCHSPACE_LOAD_WEIGHTS(lanes)                                              \
  ahead.advance(4 * 16 * sizeof(float));                                           \
  const __m512 v0 = load_fp32x16(w0 + k, lanes), v1 = load_fp32x16(w1 + k, lanes); \
  const __m512 v2 = load_fp32x16(w2 + k, lanes), v3 = load_fp32x16(w3 + k, lanes);
#define ARCHSPACE_ZERO_ROW(r) \
  __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = a##r##0, a##r##2 = a##r##0, a##r##3 = a##r##0;
#define ARCHSPACE_STORE_ROW(r) _mm_storeu_ps(y + (r)*N, horizontal_sums4(a##r##0, a##r##1, a##r##2, a##r##3));

ARCHSPACE_AVX512_BF16 inline void dot_block_fp32_x4(const float* w0, const float* x, float* y, int64_t N, int64_t K,
                                                    PacedPrefetch& ahead) {
  const float *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
  const int64_t K16 = K - K % 16;
  ARCHSPACE_ZERO_ROW(0) ARCHSPACE_ZERO_ROW(1) ARCHSPACE_ZERO_ROW(2) ARCHSPACE_ZERO_ROW(3) int64_t k = 0;
  for (; k < K16; k += 16) {
    ARCHSPACE_LOAD_WEIGHTS(0xFFFF)
    ARCHSPACE_DOT_STEP(0, 0xFFFF)
    ARCHSPACE_DOT_STEP(1, 0xFFFF) ARCHSPACE_DOT_STEP(2, 0xFFFF) ARCHSPACE_DOT_STEP(3, 0xFFFF)
  }
  if (k < K) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (K - k)) - 1);
    ARCHSPACE_LOAD_WEIGHTS(tail)
    ARCHSPACE_DOT_STEP(0, tail) ARCHSPACE_DOT_STEP(1, tail) ARCHSPACE_DOT_STEP(2, tail) ARCHSPACE_DOT_STEP(3, tail)
  }
  ARCHSPACE_STORE_ROW(0) ARCHSPACE_STORE_ROW(1) ARCHSPACE_STORE_ROW(2) ARCHSPACE_STORE_ROW(3)
}

ARCHSPACE_AVX512_BF16 inline void dot_block_fp32_x1(const float* w0, const float* x, float* y, int64_t N, int64_t K,
                                                    PacedPrefetch& ahead) {
  const float *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
  const int64_t K16 = K - K % 16;
  ARCHSPACE_ZERO_ROW(0)
  int64_t k = 0;
  for (; k < K16; k += 16) {
    ARCHSPACE_LOAD_WEIGHTS(0xFFFF)
    ARCHSPACE_DOT_STEP(0, 0xFFFF)
  }
  if (k < K) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (K - k)) - 1);
    ARCHSPACE_LOAD_WEIGHTS(tail)
    ARCHSPACE_DOT_STEP(0, tail)
  }
  ARCHSPACE_STORE_ROW(0)
}
#undef ARCHSPACE_DOT_STEP
#undef ARCHSPACE_LOAD_WEIGHTS
#undef ARCHSPACE_ZERO_ROW
#undef ARCHSPACE_STORE_ROW

ARCHSPACE_AVX512_BF16 void dot_rows_avx512(const float* W, const float* x, float* y, int64_t M, int64_t N, int64_t K,
                                           int64_t n0, int64_t n1, const char* then = nullptr) {
  const WeightPrefetch prefetch(K, sizeof(float));
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    PacedPrefetch ahead = prefetch.block(W, n, n1, then, M / 4 + M % 4);
    const float* w = W + n * K;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) dot_block_fp32_x4(w, x + m * K, y + m * N + n, N, K, ahead);
    for (; m < M; ++m) dot_block_fp32_x1(w, x + m * K, y + m * N + n, N, K, ahead);
    ahead.finish();
  }
  dot_rows_scalar(W, x, M, K, n, n1, stored(y, N));
}
#pragma GCC diagnostic pop

bool cpu_has_avx2_fma() { return kernel_isa() >= CpuIsa::kAvx2; }
#endif

}  // namespace

bool uses_streaming_linear(const at::Tensor& x, const at::Tensor& weight) {
#if defined(__x86_64__)
  if (!cpu_has_avx2_fma()) return false;
#else
  return false;
#endif
  if (!x.device().is_cpu() || !weight.device().is_cpu()) return false;
  const at::ScalarType dtype = weight.scalar_type();
  if ((dtype != at::kFloat && dtype != at::kBFloat16) || x.scalar_type() != dtype) return false;
  if (weight.dim() != 2 || !weight.is_contiguous() || x.size(-1) != weight.size(1)) return false;
  // The kernel has no backward: anything autograd must see goes through at::linear.
  if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) return false;
  return x.numel() / std::max<int64_t>(1, x.size(-1)) <= streaming_linear_max_rows(dtype);
}

namespace {

// The weights one x multiplies, as the kernels see them: matrix i is W[i] [N[i], K] and its result y[i].
template <typename T, typename Y>
struct Matrices {
  std::vector<const T*> W;
  std::vector<Y*> y;
  std::vector<int64_t> N;
};

template <typename T, typename Y>
Matrices<T, Y> matrices(const std::vector<at::Tensor>& weights, std::vector<at::Tensor>& ys) {
  Matrices<T, Y> m;
  for (size_t i = 0; i < weights.size(); ++i) {
    m.W.push_back(reinterpret_cast<const T*>(weights[i].const_data_ptr()));
    m.y.push_back(reinterpret_cast<Y*>(ys[i].mutable_data_ptr()));
    m.N.push_back(weights[i].size(0));
  }
  return m;
}

void streaming_linear_fp32(const at::Tensor& x, int64_t M, int64_t K, const std::vector<at::Tensor>& weights,
                           std::vector<at::Tensor>& ys, CpuIsa isa) {
  const auto m = matrices<float, float>(weights, ys);
  const float* xp = x.const_data_ptr<float>();
  for_feature_blocks(m.N.data(), m.W.data(), m.N.size(), [&](size_t i, int64_t n0, int64_t n1, const char* then) {
#if defined(__x86_64__)
    if (isa >= CpuIsa::kAvx512Bf16) return dot_rows_avx512(m.W[i], xp, m.y[i], M, m.N[i], K, n0, n1, then);
    if (isa >= CpuIsa::kAvx2) return dot_rows_avx2(m.W[i], xp, M, K, n0, n1, then, stored(m.y[i], m.N[i]));
#endif
    dot_rows_scalar(m.W[i], xp, M, K, n0, n1, stored(m.y[i], m.N[i]));
  });
}

void streaming_linear_bf16(const at::Tensor& x, int64_t M, int64_t K, const std::vector<at::Tensor>& weights,
                           std::vector<at::Tensor>& ys, CpuIsa isa) {
  const auto m = matrices<uint16_t, c10::BFloat16>(weights, ys);
#if defined(__x86_64__)
  if (isa >= CpuIsa::kAvx512Bf16) {
    const auto* xp = reinterpret_cast<const uint16_t*>(x.const_data_ptr<at::BFloat16>());
    return for_feature_blocks(m.N.data(), m.W.data(), m.N.size(),
                              [&](size_t i, int64_t n0, int64_t n1, const char* then) {
                                dot_rows_bf16x(m.W[i], xp, M, K, n0, n1, then, rounded_to_bf16(m.y[i], m.N[i]));
                              });
  }
#endif
  const at::Tensor xf = x.to(at::kFloat);  // a few rows: widened once, not per weight block
  const float* xp = xf.const_data_ptr<float>();
  for_feature_blocks(m.N.data(), m.W.data(), m.N.size(), [&](size_t i, int64_t n0, int64_t n1, const char* then) {
#if defined(__x86_64__)
    if (isa >= CpuIsa::kAvx2) return dot_rows_avx2(m.W[i], xp, M, K, n0, n1, then, rounded_to_bf16(m.y[i], m.N[i]));
#endif
    dot_rows_scalar(m.W[i], xp, M, K, n0, n1, rounded_to_bf16(m.y[i], m.N[i]));
  });
}

}  // namespace

std::vector<at::Tensor> streaming_linear_many(const at::Tensor& x, const std::vector<at::Tensor>& weights, CpuIsa isa) {
  TORCH_CHECK(!weights.empty(), "streaming_linear: no weights");
  const int64_t K = x.size(-1);
  for (const at::Tensor& w : weights) {
    TORCH_CHECK(
        x.scalar_type() == w.scalar_type() && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
        "streaming_linear: x and the weights must all be fp32 or all bf16");
    TORCH_CHECK(w.dim() == 2 && w.size(1) == K, "streaming_linear: x has ", K, " features, a weight is ", w.sizes());
  }
  // Decoding calls this for every weight of every step: a contiguous x is read in place and each y is made in
  // its final shape, so a call dispatches one ATen op (the empty) a weight.
  const at::Tensor xc = x.contiguous();
  std::vector<at::Tensor> ws, ys;
  std::vector<int64_t> out_shape = x.sizes().vec();
  for (const at::Tensor& w : weights) {
    ws.push_back(w.contiguous());
    out_shape.back() = w.size(0);
    ys.push_back(at::empty(out_shape, x.options()));
  }
  const int64_t M = rows_of(x);
  isa = kernel_isa(isa);
  if (x.scalar_type() == at::kFloat) {
    streaming_linear_fp32(xc, M, K, ws, ys, isa);
  } else {
    streaming_linear_bf16(xc, M, K, ws, ys, isa);
  }
  return ys;
}

at::Tensor streaming_linear(const at::Tensor& x, const at::Tensor& weight, CpuIsa isa) {
  return streaming_linear_many(x, {weight}, isa).front();
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, KernelChoices choices) {
  // The streaming kernels are named in profiles (util/profiler.h): they are not ATen ops, and in decoding they are
  // most of the time.
  switch (linear_kernel(x, weight, choices)) {
    case Kernel::kInt8StreamingGemv: {
      RECORD_FUNCTION("archspace::int8_streaming_linear", c10::ArrayRef<const c10::IValue>{});
      return int8_streaming_linear(x, weight);
    }
    case Kernel::kStreamingGemv: {
      RECORD_FUNCTION("archspace::streaming_linear", c10::ArrayRef<const c10::IValue>{});
      return streaming_linear(x, weight);
    }
    case Kernel::kInt8WidenedGemm:
      return int8_widened_linear(x, weight);
    case Kernel::kFp8ScaledMm:
      return fp8_linear(x, weight);
    default:  // kBf16Widened or kAtenLinear: the policy's op widens where the rule named kBf16Widened
      return bf16_matmuls::linear(x, weight);
  }
}

std::vector<at::Tensor> linear_many(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                    KernelChoices choices) {
  switch (linear_many_kernel(x, weights, choices)) {
    case Kernel::kStreamingGemv: {
      RECORD_FUNCTION("archspace::streaming_linear", c10::ArrayRef<const c10::IValue>{});
      return streaming_linear_many(x, weights);
    }
    case Kernel::kInt8StreamingGemv: {
      RECORD_FUNCTION("archspace::int8_streaming_linear", c10::ArrayRef<const c10::IValue>{});
      return int8_streaming_linear_many(x, weights);
    }
    case Kernel::kFp8ScaledMm:
      return fp8_linear_many(x, weights);  // x cast to e4m3 once
    default: {
      std::vector<at::Tensor> ys;  // anything else (training, prefill, mixed weights): one at a time
      for (const at::Tensor& w : weights) ys.push_back(archspace::linear(x, w, choices));
      return ys;
    }
  }
}

}  // namespace archspace
