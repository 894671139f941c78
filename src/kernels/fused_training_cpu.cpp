// The CPU launch of the fused training kernels: rows in parallel, each row through the shared arithmetic
// (fused_training_math.h) in one sequential pass. What the tests run, so the GPU's arithmetic is checked on every
// machine; also what training on the CPU takes with train.fused_kernels.
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>

#include <algorithm>
#include <vector>

#include "fused_training_launch.h"
#include "fused_training_math.h"

namespace archspace::fused_training::cpu {

namespace {

// Rows a thread takes at least: ATen's grain (at::internal::GRAIN_SIZE, 32,768 elements), so that small tensors
// run on the calling thread as ATen's own elementwise ops do (a fork and join of the OpenMP team costs more than
// such a pass, and far more when a core is busy elsewhere).
int64_t row_grain(int64_t width) {
  return std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(width, 1));
}

template <class S, class R>
void norm_forward_rows(const NormForward& a) {
  const auto* x = static_cast<const S*>(a.x);
  at::parallel_for(0, a.rows, row_grain(a.width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const S* xr = x + r * a.width;
      const float rstd = rms_inverse(sum_squares(xr, 0, a.width, 1), a.width, a.eps);
      a.rstd[r] = rstd;
      if (a.residual) {
        add_rms_norm_store(static_cast<const R*>(a.residual) + r * a.width, xr, a.weight, rstd,
                           static_cast<R*>(a.out) + r * a.width, 0, a.width, 1);
      } else if (a.rope.cos) {
        const RopeTables& t = a.rope;
        rms_norm_rope_store(xr, a.weight, rstd, rope_row(t.cos, r, t.positions, t.batch_stride, t.head_dim),
                            rope_row(t.sin, r, t.positions, t.batch_stride, t.head_dim), t.head_dim,
                            static_cast<S*>(a.out) + r * a.width, 0, a.width, 1);
      } else {
        rms_norm_store(xr, a.weight, rstd, static_cast<S*>(a.out) + r * a.width, 0, a.width, 1);
      }
    }
  });
}

template <class S>
void norm_backward_rows(const NormBackward& a) {
  const int64_t blocks = (a.rows + a.rows_per_block - 1) / a.rows_per_block;
  at::parallel_for(0, blocks, std::max<int64_t>(1, row_grain(a.width) / a.rows_per_block),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t b = begin; b < end; ++b) {
                       float* dw = a.dw_partial + b * a.width;
                       for (int64_t r = b * a.rows_per_block; r < std::min(a.rows, (b + 1) * a.rows_per_block); ++r) {
                         const NormOutputGradient<S> g = norm_output_gradient<S>(a, r);
                         const S* xr = static_cast<const S*>(a.x) + r * a.width;
                         const float dot = norm_backward_dot(g, xr, a.weight, 0, a.width, 1);
                         norm_backward_store(g, xr, a.weight, a.rstd[r], dot, a.width,
                                             static_cast<S*>(a.dx) + r * a.width, dw, 0, a.width, 1);
                       }
                     }
                   });
}

template <class S>
void swiglu_rows(const Swiglu& a, bool backward) {
  const auto* gate = static_cast<const S*>(a.gate);
  const auto* up = static_cast<const S*>(a.up);
  at::parallel_for(0, a.rows, row_grain(a.width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const S* g = gate + r * a.gate_row_stride;
      const S* u = up + r * a.up_row_stride;
      const int64_t o = r * a.width;
      if (backward) {
        swiglu_backward_store(static_cast<const S*>(a.d_hidden) + o, g, u, static_cast<S*>(a.d_gate) + o,
                              static_cast<S*>(a.d_up) + o, 0, a.width, 1);
      } else {
        swiglu_store(g, u, static_cast<S*>(a.hidden) + o, 0, a.width, 1);
      }
    }
  });
}

}  // namespace

void norm_forward(const NormForward& a) {
  // The output's storage is x's promoted with the residual's: bf16 only when both are.
  if (a.x_storage == Storage::kFloat) return norm_forward_rows<float, float>(a);
  if (a.out_storage == Storage::kBf16) return norm_forward_rows<Bf16, Bf16>(a);
  norm_forward_rows<Bf16, float>(a);
}

void norm_backward(const NormBackward& a) {
  if (a.x_storage == Storage::kBf16) return norm_backward_rows<Bf16>(a);
  norm_backward_rows<float>(a);
}

void swiglu_forward(const Swiglu& a) {
  if (a.storage == Storage::kBf16) return swiglu_rows<Bf16>(a, false);
  swiglu_rows<float>(a, false);
}

void swiglu_backward(const Swiglu& a) {
  if (a.storage == Storage::kBf16) return swiglu_rows<Bf16>(a, true);
  swiglu_rows<float>(a, true);
}

}  // namespace archspace::fused_training::cpu
