// The arithmetic of the fused training kernels (include/archspace/kernels/fused_training.h), shared by their CPU
// launch (fused_training.cpp) and their CUDA launch (fused_training_cuda.cu): every value either computes comes
// from these functions, so the CPU tests hold the GPU's arithmetic to ATen's composite and to fp64. Only the order
// of a row's sums differs (a thread block's tree on the GPU, one sequential pass on the CPU).
//
// Each function loops over the elements `first, first + step, ...` below `end`: the CPU passes (0, 1), a CUDA
// thread (threadIdx.x, blockDim.x). The values and their roundings follow the ATen composite the model uses
// otherwise (model/rms_norm.cpp, model/rope.cpp, model/mlp.cpp), so the two agree to a rounding:
//   rms_norm      y = S(w * (x * rstd)), rstd = 1 / sqrt(sum(x^2) / D + eps), all in fp32 (S: x's dtype)
//   add_rms_norm  out = R(r + S(w * (x * rstd)))      (R: the residual's dtype promoted with x's)
//   rms_norm_rope the Q/K norm over the whole projection rounded to S, then each head's rotation
//                 y = S(n * cos + rotate_half(n) * sin)
//   swiglu        h = S(S(silu(g)) * u), silu(g) = g / (1 + exp(-g))
// and the backward of each is autograd's backward of that composite, the same roundings included (the gradient of
// a cast to fp32 is a cast back). Compiled without contraction into FMAs (-ffp-contract=off, nvcc -fmad=false), so
// each product and sum is rounded once, as ATen's separate kernels round them.
//
// Storage types: float, and Bf16 (kernels/device_scalars.h). Private to src.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "device_scalars.h"
#include "fused_training_launch.h"

namespace archspace::fused_training {

using kernels::Bf16;
using kernels::bits_float;
using kernels::float_bits;
using kernels::load;
using kernels::store;
using kernels::to_bf16;

// v as storage type S holds it: rounded to bf16 for Bf16, unchanged for float.
template <class S>
ARCHSPACE_HD float rounded(float v) {
  S s[1];
  store(s, 0, v);
  return load(s, 0);
}

ARCHSPACE_HD float rms_inverse(float sum_squares, int64_t width, float eps) {
  return 1.0f / sqrtf(sum_squares / static_cast<float>(width) + eps);
}

template <class S>
ARCHSPACE_HD float sum_squares(const S* x, int64_t first, int64_t end, int64_t step) {
  float s = 0.0f;
  for (int64_t i = first; i < end; i += step) {
    const float v = load(x, i);
    s += v * v;
  }
  return s;
}

// The norm's value at i, rounded to S (what the composite's `.to(x.dtype)` gives).
template <class S>
ARCHSPACE_HD float normed(const S* x, const float* w, float rstd, int64_t i) {
  return rounded<S>(w[i] * (load(x, i) * rstd));
}

template <class S>
ARCHSPACE_HD void rms_norm_store(const S* x, const float* w, float rstd, S* y, int64_t first, int64_t end,
                                 int64_t step) {
  for (int64_t i = first; i < end; i += step) store(y, i, w[i] * (load(x, i) * rstd));
}

template <class S, class R>
ARCHSPACE_HD void add_rms_norm_store(const R* residual, const S* x, const float* w, float rstd, R* out, int64_t first,
                                     int64_t end, int64_t step) {
  for (int64_t i = first; i < end; i += step) store(out, i, load(residual, i) + normed(x, w, rstd, i));
}

// rotate_half's partner of element i of a head of `head_dim`: -x[i + h/2] in the first half, x[i - h/2] in the second.
ARCHSPACE_HD int64_t rope_partner(int64_t i, int64_t head_dim) {
  const int64_t half = head_dim / 2, k = i % head_dim;
  return k < half ? i + half : i - half;
}
ARCHSPACE_HD bool rope_first_half(int64_t i, int64_t head_dim) { return i % head_dim < head_dim / 2; }

// y = S(n * cos + rotate_half(n) * sin) over a row of heads; cos and sin [head_dim] for the row's position.
template <class S>
ARCHSPACE_HD void rms_norm_rope_store(const S* x, const float* w, float rstd, const float* cos, const float* sin,
                                      int64_t head_dim, S* y, int64_t first, int64_t end, int64_t step) {
  for (int64_t i = first; i < end; i += step) {
    const int64_t k = i % head_dim, p = rope_partner(i, head_dim);
    const float partner = normed(x, w, rstd, p);
    const float rotated = rope_first_half(i, head_dim) ? -partner : partner;
    store(y, i, normed(x, w, rstd, i) * cos[k] + rotated * sin[k]);
  }
}

// The cos (or sin) row of row `row` of a [B * T, D] activation: tables [T, head_dim] (batch_stride 0) or
// [B, 1, T, head_dim] (batch_stride T * head_dim).
ARCHSPACE_HD const float* rope_row(const float* table, int64_t row, int64_t positions, int64_t batch_stride,
                                   int64_t head_dim) {
  return table + (row / positions) * batch_stride + (row % positions) * head_dim;
}

// --- backward ---

// The gradient reaching the norm's output at i from the rotation's: S(dy * cos + rotate_half^T(dy * sin)) (the
// composite's cat/narrow backward moves dy[p] * sin[p] to i, negated in the second half).
template <class S>
ARCHSPACE_HD float rope_input_gradient(const S* dy, const float* cos, const float* sin, int64_t head_dim, int64_t i) {
  const int64_t k = i % head_dim, p = rope_partner(i, head_dim), kp = p % head_dim;
  const float moved = load(dy, p) * sin[kp];
  return rounded<S>(load(dy, i) * cos[k] + (rope_first_half(i, head_dim) ? moved : -moved));
}

// The gradient at the norm's output: dy itself (plain norm) or through the rotation (rms_norm_rope).
template <class S>
struct NormOutputGradient {
  const S* dy;
  const float* cos = nullptr;  // null: no rotation
  const float* sin = nullptr;
  int64_t head_dim = 0;
  ARCHSPACE_HD float operator()(int64_t i) const {
    return cos ? rope_input_gradient(dy, cos, sin, head_dim, i) : load(dy, i);
  }
};

// Row r's gradient at the norm's output, through its position's rotation when the launch has one.
template <class S>
ARCHSPACE_HD NormOutputGradient<S> norm_output_gradient(const NormBackward& a, int64_t r) {
  NormOutputGradient<S> g{static_cast<const S*>(a.dy) + r * a.width};
  if (a.rope.cos) {
    const RopeTables& t = a.rope;
    g.cos = rope_row(t.cos, r, t.positions, t.batch_stride, t.head_dim);
    g.sin = rope_row(t.sin, r, t.positions, t.batch_stride, t.head_dim);
    g.head_dim = t.head_dim;
  }
  return g;
}

// sum(g * w * x) over the row's elements: the one reduction of the norm's backward.
template <class S>
ARCHSPACE_HD float norm_backward_dot(const NormOutputGradient<S>& g, const S* x, const float* w, int64_t first,
                                     int64_t end, int64_t step) {
  float s = 0.0f;
  for (int64_t i = first; i < end; i += step) s += (g(i) * w[i]) * load(x, i);
  return s;
}

// dx = S(rstd * g w - x * (rstd^3 * dot / D)) (autograd's x * rsqrt(mean(x^2) + eps) backward, its two terms
// summed), and dw += g * (x * rstd) into an fp32 row of partial sums.
template <class S>
ARCHSPACE_HD void norm_backward_store(const NormOutputGradient<S>& g, const S* x, const float* w, float rstd, float dot,
                                      int64_t width, S* dx, float* dw_partial, int64_t first, int64_t end,
                                      int64_t step) {
  const float coefficient = ((rstd * rstd) * rstd) * (dot / static_cast<float>(width));
  for (int64_t i = first; i < end; i += step) {
    const float gi = g(i), xi = load(x, i);
    store(dx, i, rstd * (gi * w[i]) - xi * coefficient);
    dw_partial[i] += gi * (xi * rstd);
  }
}

ARCHSPACE_HD float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <class S>
ARCHSPACE_HD void swiglu_store(const S* gate, const S* up, S* hidden, int64_t first, int64_t end, int64_t step) {
  for (int64_t i = first; i < end; i += step) {
    const float g = load(gate, i);
    store(hidden, i, rounded<S>(g / (1.0f + expf(-g))) * load(up, i));
  }
}

// du = S(dh * S(silu(g))); dg = S(S(dh * u) * sig * (1 + g * (1 - sig))) (ATen's silu_backward).
template <class S>
ARCHSPACE_HD void swiglu_backward_store(const S* d_hidden, const S* gate, const S* up, S* d_gate, S* d_up,
                                        int64_t first, int64_t end, int64_t step) {
  for (int64_t i = first; i < end; i += step) {
    const float g = load(gate, i), dh = load(d_hidden, i);
    store(d_up, i, dh * rounded<S>(g / (1.0f + expf(-g))));
    const float s = sigmoid(g);
    store(d_gate, i, ((rounded<S>(dh * load(up, i)) * s) * (1.0f + g * (1.0f - s))));
  }
}

}  // namespace archspace::fused_training
