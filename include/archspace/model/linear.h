// y = x W^T with W in nn.Linear layout [out, in]. Decoding multiplies one (or a few) rows by every weight
// matrix, which is bound by reading the weights from memory; LibTorch's CPU kernels read them at about
// 10 GB/s on our 2-core machine, against 17-22 GB/s for a plain streaming dot-product kernel. So a few
// rows on CPU take our own kernel, in fp32 or in bf16 (bf16 weights and activations, fp32 sums: half the
// bytes per token; LibTorch's bf16 GEMV reads 17 GB/s); everything else (prefill, training, autograd,
// CUDA) is at::linear. An int8 weight (model/int8_weights.h) goes to its own kernel.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "archspace/util/cpu_isa.h"

namespace archspace {

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight);

// x W_i^T for several weights that read the same x (q/k/v; gate/up), equal to linear() on each. Decoding (the
// streaming kernels, fp32/bf16 or int8 weights alike) computes them in one parallel region instead of one each.
std::vector<at::Tensor> linear_many(const at::Tensor& x, const std::vector<at::Tensor>& weights);

// Up to this many rows of x go through the streaming kernel (each weight block is read from memory once
// and reused from L1 for every row). bench_linear on the 190M shapes: the kernel is 1.2-2x faster than
// at::linear at 32 rows and even at 64, so decoding batches of up to 32 sequences (and short prefills)
// take it.
inline constexpr int64_t kStreamingLinearMaxRows = 32;

// Whether linear() would use the streaming kernel for x (exposed for tests and benchmarks).
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
