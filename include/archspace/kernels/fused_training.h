// Fused training kernels (train.fused_kernels = true): the block's elementwise work as one pass each, forward and
// backward, in place of ATen's composite (model/rms_norm.cpp: 8 ops; model/rope.cpp: 9; the SwiGLU's silu and
// product), each of which reads and writes its activation once more and keeps its own temporaries for autograd:
//   fused_rms_norm_trained       weight * (x * rsqrt(mean(x^2) + eps)) rounded to x's dtype
//   fused_add_rms_norm_trained   residual + that (the residual adds around OLMo 2/3's normalised sublayers)
//   fused_rms_norm_rope_trained  OLMo 3's Q/K norm over the whole projection, then each head's rotation
//   fused_swiglu_trained         silu(gate) * up
// Each is an autograd function whose forward keeps only its inputs and the rows' rstd (fp32), and whose backward
// is one pass per row (the weight's gradient summed over rows in fp32 partial sums).
//
// The arithmetic is one set of functions (src/kernels/fused_training_math.h) for the CPU launch and the CUDA launch;
// the values follow the composite's roundings (fp32 inside, one rounding to the activation's dtype where the
// composite rounds), so the two agree within the rounding of a row's fp32 sum and a bf16 ulp where that sum's
// difference crosses a rounding boundary (tests/unit/test_fused_training.cpp states the bounds, against the
// composite and fp64). The CUDA launch is built where CMake finds nvcc and LibTorch's CUDA
// (fused_training_cuda_built()); tests/device/check_kernels.cpp compares it with the composite on the GPU.
//
// The choice is the run's (train.fused_kernels), carried by each forward (model/forward_options.h: SequenceOptions::
// fused_kernels) to kernels/dispatch.h's rule: off, the model runs the composite, as before. Inference without
// gradients on the CPU keeps its own fused kernels (kernels/fused_norm_rope.h).
#pragma once

#include <ATen/ATen.h>

#include <utility>

namespace archspace {

// Whether this build holds the CUDA launch (nvcc and CUDA LibTorch at configure time).
bool fused_training_cuda_built();

// Whether the fused kernels can take the norm of x with `weight` (kernels/dispatch.h asks when the run chose them):
// x is fp32 or bf16 on the CPU or (in a CUDA build) on CUDA with a contiguous last dim of weight's size, and weight
// is fp32 or bf16 on x's device.
bool fused_training_norm_applies(const at::Tensor& x, const at::Tensor& weight);
// ... and residual + norm(x): a residual of x's shape on x's device whose dtype is x's promoted with its own.
bool fused_training_add_norm_applies(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight);
// ... and the Q/K norm with the rotation: x [B, T, H * head_dim], cos and sin fp32 [T, head_dim] or [B, 1, T,
// head_dim].
bool fused_training_norm_rope_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                                      const at::Tensor& sin, int64_t head_dim);
// ... and silu(gate) * up: both of one dtype and shape, last dims contiguous.
bool fused_training_swiglu_applies(const at::Tensor& gate, const at::Tensor& up);

at::Tensor fused_rms_norm_trained(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor fused_add_rms_norm_trained(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                                      double eps);
// Returns [B, H, T, head_dim], the transposed view of [B, T, H, head_dim] that model/rope.cpp's rms_norm_rope returns.
at::Tensor fused_rms_norm_rope_trained(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                                       const at::Tensor& sin, int64_t head_dim);
at::Tensor fused_swiglu_trained(const at::Tensor& gate, const at::Tensor& up);

// The kernels themselves, without autograd (the tests and tests/device/check_kernels.cpp call them directly).
namespace fused_training {

struct NormResult {
  at::Tensor out;   // x's shape; the norm's (or rotation's) output, or residual + norm
  at::Tensor rstd;  // [rows] fp32
};

// residual undefined: the norm; cos undefined: no rotation. x [..., D] (rotation: [B, T, D]).
NormResult norm_forward(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& residual = {},
                        const at::Tensor& cos = {}, const at::Tensor& sin = {}, int64_t head_dim = 0);
// dy: the gradient at the norm's output (with a rotation: at the rotation's output, [B, T, D] as the forward's out).
// Returns dx (x's dtype) and the weight's gradient in fp32.
std::pair<at::Tensor, at::Tensor> norm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                                                const at::Tensor& rstd, const at::Tensor& cos = {},
                                                const at::Tensor& sin = {}, int64_t head_dim = 0);
at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up);
std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& d_hidden, const at::Tensor& gate,
                                                  const at::Tensor& up);

}  // namespace fused_training

}  // namespace archspace
