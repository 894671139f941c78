// FP8 matmuls for training (train.fp8 = true; SequenceOptions::fp8): the block's linear layers (q/k/v/o, the MLP's
// gate/up/down) compute y = x W^T through at::_scaled_mm on float8_e4m3fn operands, with dynamic tensorwise
// scaling, as torchao's "tensorwise" float8 recipe (OLMo-core's FP8 runs) does:
//   forward        y  = x W^T   from e4m3(x), e4m3(W)
//   backward       dx = g W     from e4m3(g), e4m3(W)
//                  dW = g^T x   from e4m3(g), e4m3(x)
// Every operand, the gradient g included, is e4m3 (torchao's tensorwise default; not e5m2 for g). Each cast has its
// own scale, computed from the tensor it casts each time (no amax history): scale = 448 / max(amax, 1e-12) in fp32,
// q = e4m3(clamp(fp32(t) * scale, -448, 448)) (round to nearest even), and _scaled_mm multiplies its fp32 sums by
// the two inverse scales (1 / scale) and rounds the result once to bf16 (dW to the weight's dtype when that is fp32).
// A zero tensor has amax 0: scale 448e12, every q 0 (the guard only avoids 0 / 0). A non-finite entry makes amax
// non-finite and the result NaN, as a bf16 matmul's would be non-finite: the trainer's non-finite policy sees it.
//
// Numerics: e4m3 has 4 significant bits, unit roundoff u = 2^-4. An entry whose scaled value is normal (|q| >= 2^-6)
// is within u of it relatively; below that e4m3 is subnormal (spacing 2^-9), an absolute error of at most 2^-10 in
// scaled units, 2^-10 amax / 448 in the tensor's own. tests/unit/test_fp8_linear.cpp states the bounds that follow.
//
// The forward keeps e4m3(x) and e4m3(W) for the backward (1 byte an entry: less than the bf16 input autograd would
// keep), which transposes them where _scaled_mm wants another layout (its second operand column-major).
//
// Where the scale and cast run: one pass for amax and one that scales, clamps and casts each entry (no fp32 or scaled
// temporary, the scale staying on the device), on the CPU and, for fp32 and bf16 tensors, on CUDA (kernels/
// fp8_cast_cuda.cu, in builds with nvcc), both through one arithmetic (src/kernels/fp8_cast_math.h) held bit for bit
// to ATen's separate ops (cast_to_e4m3_composite); elsewhere (fp16 on CUDA, a build without nvcc) those ops. On CUDA,
// _scaled_mm needs every dimension (rows of x, in and out features) a multiple of 16: other shapes run
// archspace::linear instead (fp8_linear_applies says which). On a CPU without native bf16 matmuls
// (kernels/bf16_matmuls.h's rule: below AVX512-BF16, or ONEDNN_MAX_CPU_ISA=AVX2), or once oneDNN has refused the fp8
// matmul, the same arithmetic runs as an fp32 GEMM of the exactly widened e4m3 values (scripts/kernel_paths.sh checks
// both).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace archspace {

inline constexpr float kE4m3Max = 448.0f;       // the largest finite float8_e4m3fn
inline constexpr float kFp8AmaxFloor = 1e-12f;  // amax guard: scale = 448 / max(amax, this)

// A tensor cast to float8_e4m3fn with its tensorwise scale.
struct E4m3Cast {
  at::Tensor values;         // float8_e4m3fn, contiguous, the shape of the input
  at::Tensor inverse_scale;  // fp32 scalar (0-dim) on the input's device: 1 / scale
};

// The cast described above (fp32, bf16 or fp16 input).
E4m3Cast cast_to_e4m3(const at::Tensor& t);
// The same cast in ATen's separate ops (amax, the scale, clamp and cast as kernels of their own, through fp32
// temporaries) on any device: the reference the fused passes are held to, and what runs where none applies.
E4m3Cast cast_to_e4m3_composite(const at::Tensor& t);
// Whether this build has the fused cast's CUDA launch (nvcc and CUDA LibTorch found at configure time).
bool fp8_cast_cuda_built();

// Whether fp8_linear runs x W^T through _scaled_mm (false: it runs archspace::linear): on the CPU always; on CUDA
// when x's rows, the in features and the out features are all multiples of 16.
bool fp8_linear_applies(const at::Tensor& x, const at::Tensor& weight);

// y = x W^T (W [out, in], nn.Linear's layout; x [..., in]) in bf16, differentiable in x and W through the backward
// above (gradients in x's and W's dtypes).
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight);

// x W_i^T for several weights that read the same x (q/k/v; gate/up), equal to fp8_linear on each: x is cast to e4m3
// once for all of them.
std::vector<at::Tensor> fp8_linear_many(const at::Tensor& x, const std::vector<at::Tensor>& weights);

}  // namespace archspace
