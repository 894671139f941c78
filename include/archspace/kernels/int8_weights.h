// Weight-only int8 for inference (`--quantization int8` on generate, serve, eval and logits): each matmul
// weight [out, in] held as int8 values with one scale per output row, symmetric (scale = max|w_row| / 127,
// q = w / scale rounded half to even, zero point 0). Decoding is bound by reading the weights, and int8 reads
// 1 byte a weight where fp32 reads 4 and bf16 2; the activations, the embedding, the norms and the KV cache
// stay in the model's dtype. A weight is LibTorch's per-channel quantized tensor (kQInt8, axis 0), so it
// travels through the model's weight structs like any other tensor and kernels/linear.h's linear() sends it here.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "archspace/kernels/cpu_isa.h"

namespace archspace {

// `weight` [N, K], floating point, finite (an error naming `what` otherwise), on the CPU. Quantizes a block of
// rows at a time, so the fp32 temporaries stay small whatever the matrix.
at::Tensor quantize_int8_rows(const at::Tensor& weight, const std::string& what);

// Whether t is a weight quantize_int8_rows made: 2-D, contiguous, kQInt8 per-channel along axis 0.
bool is_int8_weight(const at::Tensor& t);

// q * scale per row, computed in fp32 (then cast to `dtype`): the weight the int8 kernel multiplies by.
at::Tensor dequantize_int8_rows(const at::Tensor& q, at::ScalarType dtype = at::kFloat);

// y = x W^T for an int8 W, in x's dtype (fp32 or bf16). Up to int8_streaming_linear_max_rows rows without autograd
// take the streaming kernel; more rows (prefill) widen a block of int8 rows at a time to x's dtype (exactly) for x's
// GEMM, and scale its output columns: (x q^T) * scale, the order of the streaming kernel.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight);
// The many-rows route alone, whatever the row count (kernels/dispatch.h names it kInt8WidenedGemm).
at::Tensor int8_widened_linear(const at::Tensor& x, const at::Tensor& weight);

// The most rows of x the streaming kernel takes: kStreamingLinearMaxRows (64) for fp32 x (and bf16 x widened to
// fp32 below AVX512-BF16); 16 for bf16 x with AVX512-BF16, where the other route is the bf16 GEMM.
// bench_linear --dtype int8 --int8-x bf16 on the 1B's shapes (2026-12-07, Zen 4, 2 threads), the kernel against
// at::linear on bf16 weights (without the widening pass int8's route adds): 0.88-1.20x at 16 rows (ahead on the
// memory-bound gate, down and head), 0.77-0.88x at 32, 0.69-0.84x at 64.
inline constexpr int64_t kInt8StreamingLinearMaxRowsBf16 = 16;
int64_t int8_streaming_linear_max_rows(at::ScalarType x_dtype);

// Whether int8_linear would take the streaming kernel for x and this weight (an int8 weight, few rows, no grad).
bool uses_int8_streaming_linear(const at::Tensor& x, const at::Tensor& weight);

// The streaming kernel itself, whatever the row count (for tests): y[m, n] = scale[n] * sum_k q[n, k] x[m, k]
// with fp32 sums (each int8 value is exact in fp32 and in bf16), x fp32 or bf16. `isa` picks the path, capped at
// what the CPU has: at kAvx512Bf16, bf16 x multiplies the int8 values widened to bf16 with vdpbf16ps (as bf16
// weights do: half the FMA work, which bounds batched decoding) and fp32 x uses AVX512F 16-wide FMAs; AVX2 8-wide
// at kAvx2 and scalar widen bf16 x to fp32 once. A bf16 result is the fp32 product rounded once.
at::Tensor int8_streaming_linear(const at::Tensor& x, const at::Tensor& weight, CpuIsa isa = max_cpu_isa());
// Several int8 weights with x's feature count, one result each, in one parallel region (kernels/linear.h's
// linear_many).
std::vector<at::Tensor> int8_streaming_linear_many(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                                   CpuIsa isa = max_cpu_isa());

}  // namespace archspace
