// y = x W^T with W in nn.Linear layout [out, in]. Decoding multiplies one (or a few) rows by every weight
// matrix, which is bound by reading the weights from memory; LibTorch's CPU kernels read them at about
// 10 GB/s on our 2-core machine, against 17-22 GB/s for a plain streaming dot-product kernel. So a few
// rows on CPU take our own kernel, in fp32 or in bf16 (bf16 weights and activations, fp32 sums: half the
// bytes per token; LibTorch's bf16 GEMV reads 17 GB/s); everything else (prefill, training, autograd,
// CUDA) is at::linear. An int8 weight (kernels/int8_weights.h) goes to its own kernel, and training's train.fp8 to
// kernels/fp8_linear.h: which one runs is kernels/dispatch.h's rule (linear_kernel).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "archspace/kernels/cpu_isa.h"
#include "archspace/kernels/dispatch.h"

namespace archspace {

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, KernelChoices choices = {});

// x W_i^T for several weights that read the same x (q/k/v; gate/up), equal to linear() on each. Decoding (the
// streaming kernels, fp32/bf16 or int8 weights alike) computes them in one parallel region instead of one each.
std::vector<at::Tensor> linear_many(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                    KernelChoices choices = {});

// Up to this many rows of x go through the streaming kernels (each weight block is read from memory once and
// reused from L1 for every row): 64 for fp32 and int8 weights, 32 for bf16. bench_linear on the 190M shapes
// (2026-12-04, Zen 4, 2 threads), the kernel against at::linear: fp32 1.24-2.18x at 64 rows (1.05-2.09x at
// 128), bf16 1.02-1.17x at 32 and 0.85-1.14x at 64; int8 1.26-2.56x at 64 against at::linear on fp32 weights
// (int8's other path also dequantizes every weight block first). So decoding batches of up to 64 sequences
// (32 in bf16) and short prefills take them; whole 190M decodes at batch 40 in fp32 ran at half the rate of
// batch 32 through at::linear.
inline constexpr int64_t kStreamingLinearMaxRows = 64;      // fp32 and int8 weights
inline constexpr int64_t kStreamingLinearMaxRowsBf16 = 32;  // bf16 weights
inline int64_t streaming_linear_max_rows(at::ScalarType weight_dtype) {
  return weight_dtype == at::kBFloat16 ? kStreamingLinearMaxRowsBf16 : kStreamingLinearMaxRows;
}

// Whether the streaming kernel takes x and this weight (dispatch.h's linear_kernel asks; tests and benchmarks).
bool uses_streaming_linear(const at::Tensor& x, const at::Tensor& weight);

// The streaming kernel itself, whatever the row count (for tests against at::linear). x and weight both fp32
// or both bf16. `isa` picks the code path (capped at what the CPU has), so one test run checks every path
// this machine can run: fp32 uses AVX2 at kAvx2 and AVX512F (4 x 4 blocks) at kAvx512Bf16; bf16 uses
// AVX512-BF16's dot-product instruction at kAvx512Bf16 and widens to fp32 with AVX2 below it.
at::Tensor streaming_linear(const at::Tensor& x, const at::Tensor& weight, CpuIsa isa = max_cpu_isa());
// Several weights with x's feature count, one result each, in one parallel region.
std::vector<at::Tensor> streaming_linear_many(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                              CpuIsa isa = max_cpu_isa());

}  // namespace archspace
