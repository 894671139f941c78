#include "archspace/kernels/fused_norm_rope.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "cpu_elements.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// Built with -ffp-contract=off (CMakeLists.txt): a product and a sum stay two roundings, as in ATen's separate
// ops, so fused_rope equals apply_rope exactly.

namespace archspace {

namespace {

using cpu_elements::load;
using cpu_elements::store;
#if defined(__x86_64__)
using cpu_elements::load8;
#endif

bool wants_grad(const at::Tensor& t) { return at::GradMode::is_enabled() && t.requires_grad(); }

bool float_or_bf16(const at::Tensor& t) { return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16; }

template <typename T>
float sum_of_squares_scalar(const T* x, int64_t D) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // the AVX2 path's lane order, so both paths sum alike
  int64_t i = 0;
  for (; i + 8 <= D; i += 8)
    for (int l = 0; l < 8; ++l) {
      const float v = load(x, i + l);
      lanes[l] += v * v;
    }
  float s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
  for (; i < D; ++i) {
    const float v = load(x, i);
    s += v * v;
  }
  return s;
}

#if defined(__x86_64__)

template <typename T>
__attribute__((target("avx2,fma"))) float sum_of_squares_avx2(const T* x, int64_t D) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= D; i += 8) {
    const __m256 v = load8(x + i);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
  for (; i < D; ++i) {
    const float v = load(x, i);
    s += v * v;
  }
  return s;
}
#endif

// 1 / sqrt(mean(x^2) + eps) of one row, as the ATen form: the sum (8 lanes), / D, + eps, 1 / sqrt, each in fp32.
template <typename T>
float inverse_rms(const T* x, int64_t D, float eps, CpuIsa isa) {
#if defined(__x86_64__)
  const float ss = isa >= CpuIsa::kAvx2 ? sum_of_squares_avx2(x, D) : sum_of_squares_scalar(x, D);
#else
  (void)isa;
  const float ss = sum_of_squares_scalar(x, D);
#endif
  return 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
}

// A value as x's dtype holds it: the rounding a tensor of T applies between two ATen ops.
inline float rounded(float v, const float*) { return v; }
inline float rounded(float v, const at::BFloat16*) { return static_cast<float>(at::BFloat16(v)); }

// y = w * normed x per row; with `residual` (rows of D, contiguous), y = residual + that, the norm rounded to T first
// as the separate ATen add sees it.
template <typename T, typename W>
void rms_norm_rows(const T* x, const W* w, T* y, int64_t rows, int64_t D, int64_t x_row_stride, float eps, CpuIsa isa,
                   const T* residual = nullptr) {
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * x_row_stride;
      T* yr = y + r * D;
      const float inv = inverse_rms(xr, D, eps, isa);
      if (residual) {
        const T* rr = residual + r * D;
        for (int64_t i = 0; i < D; ++i) store(yr, i, load(rr, i) + rounded(load(w, i) * (load(xr, i) * inv), yr));
        continue;
      }
      for (int64_t i = 0; i < D; ++i) {
        const float normed = load(xr, i) * inv;
        store(yr, i, load(w, i) * normed);
      }
    }
  });
}

template <typename T>
void rope_rows(const T* x, T* y, const float* cos, const float* sin, int64_t B, int64_t H, int64_t Tn, int64_t h,
               const int64_t x_strides[3], const int64_t y_strides[3], bool per_batch_tables) {
  const int64_t half = h / 2;
  // A decode step's rows are a few heads of one position: one thread, unless there is real work to share.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(Tn * h, 1));
  at::parallel_for(0, B * H, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = p / H, hd = p % H;
      for (int64_t t = 0; t < Tn; ++t) {
        const T* xr = x + b * x_strides[0] + hd * x_strides[1] + t * x_strides[2];
        T* yr = y + b * y_strides[0] + hd * y_strides[1] + t * y_strides[2];
        const int64_t table_row = (per_batch_tables ? b * Tn : 0) + t;
        const float* c = cos + table_row * h;
        const float* s = sin + table_row * h;
        for (int64_t i = 0; i < half; ++i) {
          const float a = load(xr, i), bb = load(xr, i + half);
          // rotate_half: (-x2, x1); (-x2) * s == -(x2 * s) exactly, as ATen's neg then mul gives
          const float lo = a * c[i] + (-bb) * s[i];
          const float hi = bb * c[i + half] + a * s[i + half];
          store(yr, i, lo);
          store(yr, i + half, hi);
        }
      }
    }
  });
}

// rms_norm over each row of x [rows = B * T, D = H * h], rounded to T as fused_rms_norm stores it, then the rotary
// embedding of each head's h values as rope_rows computes it, into y [B, T, H, h] (contiguous). The norm's sum is
// fused_rms_norm's (the same function), so each value equals fused_rope(fused_rms_norm(x)) bit for bit.
template <typename T, typename W>
void norm_rope_rows(const T* x, const W* w, T* y, int64_t B, int64_t Tn, int64_t D, int64_t h, int64_t x_row_stride,
                    float eps, const float* cos, const float* sin, bool per_batch_tables, CpuIsa isa) {
  const int64_t half = h / 2, heads = D / h;
  at::parallel_for(0, B * Tn, std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * x_row_stride;
      T* yr = y + r * D;
      const float inv = inverse_rms(xr, D, eps, isa);
      const int64_t b = r / Tn, t = r % Tn;
      const int64_t table_row = (per_batch_tables ? b * Tn : 0) + t;
      const float* c = cos + table_row * h;
      const float* s = sin + table_row * h;
      for (int64_t hd = 0; hd < heads; ++hd) {
        const int64_t o = hd * h;
        for (int64_t i = 0; i < half; ++i) {
          const float a = rounded(load(w, o + i) * (load(xr, o + i) * inv), yr);
          const float bb = rounded(load(w, o + i + half) * (load(xr, o + i + half) * inv), yr);
          store(yr, o + i, a * c[i] + (-bb) * s[i]);
          store(yr, o + i + half, bb * c[i + half] + a * s[i + half]);
        }
      }
    }
  });
}

}  // namespace

bool uses_fused_rms_norm(const at::Tensor& x, const at::Tensor& weight) {
  if (!x.device().is_cpu() || !weight.device().is_cpu()) return false;
  if (!float_or_bf16(x) || !float_or_bf16(weight) || wants_grad(x) || wants_grad(weight)) return false;
  if (x.dim() < 1 || weight.dim() != 1 || x.size(-1) != weight.size(0) || !weight.is_contiguous()) return false;
  return x.stride(-1) == 1;
}

namespace {

// fused_rms_norm, and fused_add_rms_norm when `residual` is defined.
at::Tensor rms_norm_impl(const at::Tensor& x, const at::Tensor& weight, double eps, CpuIsa isa,
                         const at::Tensor& residual) {
  isa = kernel_isa(isa);
  const int64_t D = x.size(-1);
  // Rows of x: any leading layout whose rows are evenly spaced (a contiguous tensor, or a narrowed one).
  at::Tensor xr = x.dim() == 1 ? x.unsqueeze(0) : x.reshape({-1, D});
  if (xr.stride(-1) != 1) xr = xr.contiguous();
  const int64_t rows = xr.size(0);
  at::Tensor y = at::empty({rows, D}, x.options().memory_format(at::MemoryFormat::Contiguous));
  const float e = static_cast<float>(eps);
  auto run = [&](auto* xp, auto* yp) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(xp)>>;
    const T* rp = residual.defined() ? residual.const_data_ptr<T>() : nullptr;
    if (weight.scalar_type() == at::kFloat)
      rms_norm_rows(xp, weight.const_data_ptr<float>(), yp, rows, D, xr.stride(0), e, isa, rp);
    else
      rms_norm_rows(xp, weight.const_data_ptr<at::BFloat16>(), yp, rows, D, xr.stride(0), e, isa, rp);
  };
  if (x.scalar_type() == at::kFloat)
    run(xr.const_data_ptr<float>(), y.mutable_data_ptr<float>());
  else
    run(xr.const_data_ptr<at::BFloat16>(), y.mutable_data_ptr<at::BFloat16>());
  return y.view(x.sizes());
}

}  // namespace

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, CpuIsa isa) {
  TORCH_CHECK(uses_fused_rms_norm(x, weight), "fused_rms_norm: unsupported arguments");
  return rms_norm_impl(x, weight, eps, isa, at::Tensor());
}

bool uses_fused_add_rms_norm(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight) {
  if (!uses_fused_rms_norm(x, weight) || !residual.device().is_cpu() || wants_grad(residual)) return false;
  return residual.scalar_type() == x.scalar_type() && residual.sizes() == x.sizes() && residual.is_contiguous();
}

at::Tensor fused_add_rms_norm(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps,
                              CpuIsa isa) {
  TORCH_CHECK(uses_fused_add_rms_norm(residual, x, weight), "fused_add_rms_norm: unsupported arguments");
  return rms_norm_impl(x, weight, eps, isa, residual);
}

bool uses_fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (!x.device().is_cpu() || !cos.device().is_cpu() || !sin.device().is_cpu()) return false;
  if (!float_or_bf16(x) || cos.scalar_type() != at::kFloat || sin.scalar_type() != at::kFloat) return false;
  if (wants_grad(x) || wants_grad(cos) || wants_grad(sin)) return false;
  if (x.dim() != 4 || x.stride(3) != 1 || x.size(3) % 2 != 0) return false;
  if (!cos.is_contiguous() || !sin.is_contiguous() || cos.sizes() != sin.sizes()) return false;
  const int64_t B = x.size(0), T = x.size(2), h = x.size(3);
  if (cos.dim() == 2) return cos.size(0) == T && cos.size(1) == h;
  return cos.dim() == 4 && cos.size(0) == B && cos.size(1) == 1 && cos.size(2) == T && cos.size(3) == h;
}

at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(uses_fused_rope(x, cos, sin), "fused_rope: unsupported arguments");
  at::Tensor y = at::empty_like(x);  // x's strides (a transposed [B, T, H, h] stays one)
  if (y.stride(3) != 1) y = at::empty(x.sizes(), x.options());
  const int64_t xs[3] = {x.stride(0), x.stride(1), x.stride(2)}, ys[3] = {y.stride(0), y.stride(1), y.stride(2)};
  const bool per_batch = cos.dim() == 4;
  if (x.scalar_type() == at::kFloat)
    rope_rows(x.const_data_ptr<float>(), y.mutable_data_ptr<float>(), cos.const_data_ptr<float>(),
              sin.const_data_ptr<float>(), x.size(0), x.size(1), x.size(2), x.size(3), xs, ys, per_batch);
  else
    rope_rows(x.const_data_ptr<at::BFloat16>(), y.mutable_data_ptr<at::BFloat16>(), cos.const_data_ptr<float>(),
              sin.const_data_ptr<float>(), x.size(0), x.size(1), x.size(2), x.size(3), xs, ys, per_batch);
  return y;
}

bool uses_fused_rms_norm_rope(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                              const at::Tensor& sin, int64_t head_dim) {
  if (!uses_fused_rms_norm(x, weight) || x.dim() != 3 || head_dim < 2 || head_dim % 2 != 0) return false;
  if (x.size(2) % head_dim != 0) return false;
  // fused_rope's tables (checked here without making the heads' view: this runs twice a layer in decoding).
  if (!cos.device().is_cpu() || !sin.device().is_cpu() || cos.scalar_type() != at::kFloat ||
      sin.scalar_type() != at::kFloat || wants_grad(cos) || wants_grad(sin))
    return false;
  if (!cos.is_contiguous() || !sin.is_contiguous() || cos.sizes() != sin.sizes()) return false;
  const int64_t B = x.size(0), T = x.size(1);
  if (cos.dim() == 2) return cos.size(0) == T && cos.size(1) == head_dim;
  return cos.dim() == 4 && cos.size(0) == B && cos.size(1) == 1 && cos.size(2) == T && cos.size(3) == head_dim;
}

at::Tensor fused_rms_norm_rope(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                               const at::Tensor& sin, int64_t head_dim, CpuIsa isa) {
  TORCH_CHECK(uses_fused_rms_norm_rope(x, weight, cos, sin, head_dim), "fused_rms_norm_rope: unsupported arguments");
  isa = kernel_isa(isa);
  const int64_t B = x.size(0), Tn = x.size(1), D = x.size(2);
  at::Tensor xr = x.reshape({-1, D});
  if (xr.stride(-1) != 1) xr = xr.contiguous();
  at::Tensor y = at::empty({B, Tn, D / head_dim, head_dim}, x.options().memory_format(at::MemoryFormat::Contiguous));
  const bool per_batch = cos.dim() == 4;
  const float e = static_cast<float>(eps);
  auto run = [&](auto* xp, auto* yp) {
    if (weight.scalar_type() == at::kFloat)
      norm_rope_rows(xp, weight.const_data_ptr<float>(), yp, B, Tn, D, head_dim, xr.stride(0), e,
                     cos.const_data_ptr<float>(), sin.const_data_ptr<float>(), per_batch, isa);
    else
      norm_rope_rows(xp, weight.const_data_ptr<at::BFloat16>(), yp, B, Tn, D, head_dim, xr.stride(0), e,
                     cos.const_data_ptr<float>(), sin.const_data_ptr<float>(), per_batch, isa);
  };
  if (x.scalar_type() == at::kFloat)
    run(xr.const_data_ptr<float>(), y.mutable_data_ptr<float>());
  else
    run(xr.const_data_ptr<at::BFloat16>(), y.mutable_data_ptr<at::BFloat16>());
  return y.transpose(1, 2);
}

}  // namespace archspace
