#include "archspace/kernels/int8_weights.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "archspace/kernels/bf16_matmuls.h"
#include "archspace/kernels/linear.h"
#include "archspace/util/error.h"
#include "streaming_gemv.h"
#include "streaming_gemv_bf16.h"

namespace archspace {

namespace {

using namespace streaming_gemv;

// Rows of weights quantized or dequantized per block: [4096, 4096] fp32 is 64 MB, whatever the matrix.
constexpr int64_t kRowBlock = 4096;
// Bytes of int8 rows widened at a time for a prefill GEMM (the block stays in the last-level cache between its
// widening and its GEMM: 64 MB blocks made the 1B's int8 prefill 8% slower, 8 MB ones were no faster than 32).
constexpr int64_t kWidenedBlockBytes = int64_t{32} << 20;

const int8_t* int8_values(const at::Tensor& q) { return static_cast<const int8_t*>(q.const_data_ptr()); }

// The per-row scales [N] (double) of t when it is an int8 weight, else an undefined tensor. Read from the
// tensor's quantizer, not through the dispatcher (qscheme(), q_per_channel_axis() and q_per_channel_scales()
// are operators, about a microsecond each): linear() asks for every weight of every decode step.
at::Tensor int8_scales_or_undefined(const at::Tensor& t) {
  if (!t.defined() || !t.is_quantized() || t.scalar_type() != at::kQInt8 || t.dim() != 2 || !t.is_contiguous() ||
      !t.device().is_cpu())
    return {};
  const at::QuantizerPtr q = at::get_qtensorimpl(t)->quantizer();
  if (q->qscheme() != at::kPerChannelAffine) return {};
  const auto* per_channel = static_cast<const at::PerChannelAffineQuantizer*>(q.get());
  at::Tensor scales = per_channel->scales();  // the kernel reads them as contiguous doubles
  if (per_channel->axis() != 0 || scales.scalar_type() != at::kDouble || !scales.is_contiguous()) return {};
  return scales;
}

// y[m, n] = scale[n] * sum_k W[n, k] x[m, k]: each fp32 sum times its row's scale (as an fp32) once; into bf16,
// that product rounded once to nearest even.
inline auto scaled(float* y, int64_t N, const double* scale) {
  return [y, N, scale](int64_t m, int64_t n, float sum) { y[m * N + n] = sum * static_cast<float>(scale[n]); };
}
inline auto scaled(c10::BFloat16* y, int64_t N, const double* scale) {
  return [y, N, scale](int64_t m, int64_t n, float sum) {
    y[m * N + n] = c10::BFloat16(sum * static_cast<float>(scale[n]));
  };
}

#if defined(__x86_64__)
// The vector kernels take four weight rows against several rows of x a pass (AVX512: 4, 2 or 1; AVX2: 2 or 1,
// streaming_gemv.h), so each block of weights is widened from int8 once per pass, not once per row of x:
// batched decoding (evaluation's generation tasks, `serve`) is bound by the widening, not by memory.
// AVX512F: 16 weights widened per load, 4 x 4 accumulators (of 32 registers). GCC 12's AVX512 cast intrinsics
// start from _mm256_undefined_*(), which -Wmaybe-uninitialized reports (a false positive: every lane is written).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define ARCHSPACE_AVX512 __attribute__((target("avx2,fma,avx512f")))

ARCHSPACE_AVX512 inline __m512 load_int8x16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

ARCHSPACE_AVX512 inline __m256 fold16(__m512 a) {  // lanes 0-7 plus lanes 8-15
  return _mm512_castps512_ps256(_mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, 0x4E)));
}

// One pass of dot_rows_int8_avx512, as streaming_gemv.h's dot_block_avx2 with 16 lanes: each accumulator folded
// to 8 (fold16) before the eight-way sums.
template <int R, typename Out>
ARCHSPACE_AVX512 inline void dot_block_int8_avx512(const int8_t* w, const float* x, int64_t m, int64_t n, int64_t K,
                                                   PacedPrefetch& ahead, const Out& out) {
  const int64_t K16 = K - K % 16;
  x += m * K;
  __m512 a[R][4];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) a[r][i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K16; k += 16) {
    ahead.advance(4 * 16);
    __m512 v[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) v[i] = load_int8x16(w + i * K + k);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * K + k);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) a[r][i] = _mm512_fmadd_ps(v[i], xv, a[r][i]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r += 2) {
    const int q = r + 1 < R ? r + 1 : r;
    alignas(32) float s[8];
    _mm256_store_ps(s, horizontal_sums8(fold16(a[r][0]), fold16(a[r][1]), fold16(a[r][2]), fold16(a[r][3]),
                                        fold16(a[q][0]), fold16(a[q][1]), fold16(a[q][2]), fold16(a[q][3])));
    for (int j = 0; j <= q - r; ++j) {
      const float* xr = x + (r + j) * K;
      for (int i = 0; i < 4; ++i) {
        float sum = s[4 * j + i];
        for (int64_t k = K16; k < K; ++k) sum += widen(w[i * K + k]) * xr[k];
        out(m + r + j, n + i, sum);
      }
    }
  }
}

ARCHSPACE_AVX512 void dot_rows_int8_avx512(const int8_t* W, const double* scale, const float* x, float* y, int64_t M,
                                           int64_t N, int64_t K, int64_t n0, int64_t n1, const char* then = nullptr) {
  const WeightPrefetch prefetch(K, sizeof(int8_t));
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    PacedPrefetch ahead = prefetch.block(W, n, n1, then, M / 4 + M % 4 / 2 + M % 2);
    const int8_t* w = W + n * K;
    const auto out = scaled(y, N, scale);
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) dot_block_int8_avx512<4>(w, x, m, n, K, ahead, out);
    for (; m + 2 <= M; m += 2) dot_block_int8_avx512<2>(w, x, m, n, K, ahead, out);
    for (; m < M; ++m) dot_block_int8_avx512<1>(w, x, m, n, K, ahead, out);
    ahead.finish();
  }
  dot_rows_scalar(W, x, M, K, n, n1, scaled(y, N, scale));
}
#undef ARCHSPACE_AVX512
#pragma GCC diagnostic pop
#endif

// Rows [r, r + b) of q as q * scale in fp32, then cast to dtype.
at::Tensor dequantized_rows(const at::Tensor& q, const at::Tensor& all_scales, int64_t r, int64_t b,
                            at::ScalarType dtype) {
  const at::Tensor values =
      at::from_blob(const_cast<int8_t*>(int8_values(q) + r * q.size(1)), {b, q.size(1)}, at::kChar);
  const at::Tensor scales = all_scales.narrow(0, r, b).to(at::kFloat);
  return values.to(at::kFloat).mul_(scales.unsqueeze(1)).to(dtype);
}

// n int8 values widened to fp32, or to bf16 (exact both ways: |q| <= 127 needs 7 bits of significand, bf16 has 8,
// so a value's bf16 bits are the top half of its fp32 bits). Plain loops the compiler vectorises, over the threads:
// ATen's int8 -> bf16 copy_ went through a slower element-wise path (13% of a 1B prefill against ~3% here).
void widen_int8(const int8_t* q, at::Tensor& out, int64_t n) {
  at::parallel_for(0, n, int64_t{1} << 16, [&](int64_t i0, int64_t i1) {
    if (out.scalar_type() == at::kFloat) {
      float* o = out.mutable_data_ptr<float>();
      for (int64_t i = i0; i < i1; ++i) o[i] = static_cast<float>(q[i]);
    } else {
      auto* o = reinterpret_cast<uint16_t*>(out.mutable_data_ptr());
      for (int64_t i = i0; i < i1; ++i) {
        const float f = static_cast<float>(q[i]);
        uint32_t bits;
        std::memcpy(&bits, &f, sizeof bits);
        o[i] = static_cast<uint16_t>(bits >> 16);
      }
    }
  });
}

// One row of y times the per-column scales, in place: fp32, or bf16 (each product in fp32, rounded once to nearest
// even: the products are finite sums of a GEMM, and a NaN or Inf stays one).
void scale_row(float* row, const float* scale, int64_t N) {
  for (int64_t n = 0; n < N; ++n) row[n] *= scale[n];
}
void scale_row(uint16_t* row, const float* scale, int64_t N) {
  for (int64_t n = 0; n < N; ++n) {
    const uint32_t widened = static_cast<uint32_t>(row[n]) << 16;
    float f;
    std::memcpy(&f, &widened, sizeof f);
    f *= scale[n];
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    row[n] = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
  }
}

// y[m, n] *= scale[n], y [M, N] contiguous fp32 or bf16, over the threads. Plain loops the compiler vectorises:
// ATen's in-place bf16 * fp32 goes through casting copies (7% of a 1B prefill).
void scale_columns(at::Tensor& y, const float* scale) {
  const int64_t N = y.size(-1), M = N > 0 ? y.numel() / N : 0;
  const bool fp32 = y.scalar_type() == at::kFloat;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(N, 1));
  at::parallel_for(0, M, grain, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      if (fp32)
        scale_row(y.mutable_data_ptr<float>() + m * N, scale, N);
      else
        scale_row(reinterpret_cast<uint16_t*>(y.mutable_data_ptr()) + m * N, scale, N);
    }
  });
}

// Rows [r, r + b) of q's int8 values widened (exactly) to dtype (fp32 or bf16). With `reuse`, into this thread's
// buffer, which the next call overwrites: the caller must be done with it by then. It keeps the largest block
// seen (at most kWidenedBlockBytes, beside the model's own bytes).
at::Tensor weight_rows_widened(const at::Tensor& q, int64_t r, int64_t b, at::ScalarType dtype, bool reuse) {
  if (dtype != at::kFloat && dtype != at::kBFloat16)
    throw Error(std::string("int8_linear: x must be fp32 or bf16, got ") + c10::toString(dtype));
  const int64_t K = q.size(1);
  const int8_t* values = int8_values(q) + r * K;
  thread_local at::Tensor buffer;
  at::Tensor out;
  if (!reuse) {
    out = at::empty({b, K}, at::TensorOptions().dtype(dtype));
  } else {
    if (!buffer.defined() || buffer.scalar_type() != dtype || buffer.numel() < b * K)
      buffer = at::empty({std::max(b * K, buffer.defined() ? buffer.numel() : 0)}, at::TensorOptions().dtype(dtype));
    out = buffer.narrow(0, 0, b * K).view({b, K});
  }
  widen_int8(values, out, b * K);
  return out;
}

// The scales of an int8 weight; an error naming `who` for anything else.
at::Tensor checked_int8_scales(const at::Tensor& weight, const char* who) {
  at::Tensor scales = int8_scales_or_undefined(weight);
  if (!scales.defined()) {
    throw Error(std::string(who) + ": the weight is not an int8 weight of quantize_int8_rows (got " +
                (weight.defined() ? std::string(c10::toString(weight.scalar_type())) : std::string("undefined")) + ")");
  }
  return scales;
}

}  // namespace

at::Tensor quantize_int8_rows(const at::Tensor& weight, const std::string& what) {
  if (!weight.defined() || weight.dim() != 2 || !weight.is_floating_point()) {
    throw Error(what + ": int8 quantization takes a 2-D floating-point weight, got " +
                (weight.defined() ? std::string(c10::toString(weight.scalar_type())) + " with " +
                                        std::to_string(weight.dim()) + " dimensions"
                                  : std::string("undefined")));
  }
  const int64_t N = weight.size(0), K = weight.size(1);
  at::Tensor q = at::empty({N, K}, at::kChar);
  at::Tensor scales = at::empty({N}, at::kFloat);
  for (int64_t r = 0; r < N; r += kRowBlock) {
    const int64_t b = std::min(kRowBlock, N - r);
    const at::Tensor w = weight.narrow(0, r, b).to(at::kCPU, at::kFloat);
    if (!at::isfinite(w).all().item<bool>()) {
      throw Error(what + ": holds NaN or infinite values, which int8 quantization cannot represent");
    }
    at::Tensor s = w.abs().amax(1).div_(127.0f);
    // An all-zero row (or one so small that max/127 underflows) quantizes to zeros with any scale.
    s = at::where(s > 0, s, at::ones_like(s));
    // round() is half to even; |w / s| <= 127 up to one rounding, so the clamp only guards that rounding.
    q.narrow(0, r, b).copy_(w.div(s.unsqueeze(1)).round_().clamp_(-127, 127));
    scales.narrow(0, r, b).copy_(s);
  }
  return at::_make_per_channel_quantized_tensor(q, scales.to(at::kDouble), at::zeros({N}, at::kLong), 0);
}

bool is_int8_weight(const at::Tensor& t) { return t.is_quantized() && int8_scales_or_undefined(t).defined(); }

at::Tensor dequantize_int8_rows(const at::Tensor& q, at::ScalarType dtype) {
  return dequantized_rows(q, checked_int8_scales(q, "dequantize_int8_rows"), 0, q.size(0), dtype);
}

std::vector<at::Tensor> int8_streaming_linear_many(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                                   CpuIsa isa) {
  if (weights.empty()) throw Error("int8_streaming_linear: no weights");
  const int64_t K = x.size(-1);
  std::vector<at::Tensor> scales;
  for (const at::Tensor& w : weights) {
    scales.push_back(checked_int8_scales(w, "int8_streaming_linear"));
    if (!x.device().is_cpu() || (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) || w.size(1) != K) {
      throw Error("int8_streaming_linear: x must be fp32 or bf16 on the CPU with " + std::to_string(w.size(1)) +
                  " features, got " + std::string(c10::toString(x.scalar_type())) + " with " + std::to_string(K));
    }
  }
  const int64_t M = rows_of(x);
  std::vector<int64_t> out_shape = x.sizes().vec();
  std::vector<at::Tensor> ys;
  std::vector<const int8_t*> W;
  std::vector<const double*> sp;
  std::vector<int64_t> N;
  for (size_t i = 0; i < weights.size(); ++i) {
    out_shape.back() = weights[i].size(0);
    ys.push_back(at::empty(out_shape, x.options()));
    W.push_back(int8_values(weights[i]));
    sp.push_back(scales[i].const_data_ptr<double>());
    N.push_back(weights[i].size(0));
  }
  isa = kernel_isa(isa);
#if defined(__x86_64__)
  if (x.scalar_type() == at::kBFloat16 && isa >= CpuIsa::kAvx512Bf16) {
    // bf16 x with AVX512-BF16: x stays bf16, each int8 weight is widened to bf16 in registers and multiplied by
    // vdpbf16ps (streaming_gemv_bf16.h), as bf16 weights are.
    const at::Tensor xc = x.contiguous();
    const auto* xp = reinterpret_cast<const uint16_t*>(xc.const_data_ptr<at::BFloat16>());
    for_feature_blocks(N.data(), W.data(), N.size(), [&](size_t i, int64_t n0, int64_t n1, const char* then) {
      dot_rows_bf16x(W[i], xp, M, K, n0, n1, then, scaled(ys[i].mutable_data_ptr<at::BFloat16>(), N[i], sp[i]));
    });
    return ys;
  }
#endif
  // fp32 x (read in place, so a decode call dispatches one ATen op, the empty, a weight besides the kernel), or bf16
  // x widened once (a few rows) where bf16 does not run natively: fp32 sums of fp32 FMAs, the result rounded to
  // bf16 once.
  const bool fp32 = x.scalar_type() == at::kFloat;
  const at::Tensor xf = fp32 ? x.contiguous() : x.to(at::kFloat).contiguous();
  std::vector<at::Tensor> ys32;
  std::vector<float*> yp;
  for (size_t i = 0; i < weights.size(); ++i) {
    ys32.push_back(fp32 ? ys[i] : at::empty_like(ys[i], ys[i].options().dtype(at::kFloat)));
    yp.push_back(ys32.back().mutable_data_ptr<float>());
  }
  const float* xp = xf.const_data_ptr<float>();
  for_feature_blocks(N.data(), W.data(), N.size(), [&](size_t i, int64_t n0, int64_t n1, const char* then) {
#if defined(__x86_64__)
    if (isa >= CpuIsa::kAvx512Bf16) return dot_rows_int8_avx512(W[i], sp[i], xp, yp[i], M, N[i], K, n0, n1, then);
    if (isa >= CpuIsa::kAvx2) return dot_rows_avx2(W[i], xp, M, K, n0, n1, then, scaled(yp[i], N[i], sp[i]));
#endif
    dot_rows_scalar(W[i], xp, M, K, n0, n1, scaled(yp[i], N[i], sp[i]));
  });
  if (!fp32)
    for (size_t i = 0; i < ys.size(); ++i) ys[i].copy_(ys32[i]);
  return ys;
}

at::Tensor int8_streaming_linear(const at::Tensor& x, const at::Tensor& weight, CpuIsa isa) {
  return int8_streaming_linear_many(x, {weight}, isa).front();
}

int64_t int8_streaming_linear_max_rows(at::ScalarType x_dtype) {
  return x_dtype == at::kBFloat16 && kernel_isa() >= CpuIsa::kAvx512Bf16 ? kInt8StreamingLinearMaxRowsBf16
                                                                         : kStreamingLinearMaxRows;
}

bool uses_int8_streaming_linear(const at::Tensor& x, const at::Tensor& weight) {
  if (!is_int8_weight(weight) || !x.device().is_cpu()) return false;
  if ((x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) || x.size(-1) != weight.size(1)) return false;
  const int64_t rows = x.size(-1) > 0 ? x.numel() / x.size(-1) : 0;
  return rows <= int8_streaming_linear_max_rows(x.scalar_type()) && !(at::GradMode::is_enabled() && x.requires_grad());
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight) {
  (void)checked_int8_scales(weight, "int8_linear");
  return archspace::linear(x, weight);  // kernels/dispatch.h: the streaming kernel or the widened GEMM
}

at::Tensor int8_widened_linear(const at::Tensor& x, const at::Tensor& weight) {
  const at::Tensor scales = checked_int8_scales(weight, "int8_linear");
  const int64_t N = weight.size(0);
  const bool needs_grad = at::GradMode::is_enabled() && x.requires_grad();
  // Many rows (prefill, scoring): compute-bound, so x's own GEMM. A block of weight rows at a time is widened to
  // x's dtype, which holds every int8 value exactly, and each output column is scaled once after the sums:
  // y = (x q^T) * scale, the decode kernel's order. Multiplying the scale in first (q * scale rounded to bf16)
  // would round every weight; widening instead costs one pass over the int8 bytes, into a buffer reused
  // from call to call (a fresh one would fault in its pages on every call). The cat keeps autograd's path
  // through x; with autograd on, the widened block is saved for the backward pass, so it is never reused.
  const int64_t K = weight.size(1), width = static_cast<int64_t>(c10::elementSize(x.scalar_type()));
  const int64_t block = std::max<int64_t>(1, kWidenedBlockBytes / std::max<int64_t>(1, K * width));
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < N; r += block) {
    const int64_t b = std::min(block, N - r);
    const at::Tensor q = weight_rows_widened(weight, r, b, x.scalar_type(), /*reuse=*/!needs_grad);
    at::Tensor y = bf16_matmuls::linear(x, q);
    const at::Tensor s = scales.narrow(0, r, b).to(at::kFloat);
    // Each product in fp32, rounded once to y's dtype; in place without autograd.
    if (needs_grad) {
      parts.push_back((y * s).to(y.scalar_type()));
    } else {
      scale_columns(y, s.const_data_ptr<float>());
      parts.push_back(y);
    }
  }
  return parts.size() == 1 ? parts.front() : at::cat(parts, -1);
}

}  // namespace archspace
