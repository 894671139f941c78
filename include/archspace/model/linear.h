// y = x W^T with W in nn.Linear layout [out, in]. Decoding multiplies one (or a few) rows by every weight
// matrix, which is bound by reading the weights from memory; LibTorch's CPU kernels read them at about
// 10 GB/s on our 2-core machine, against 17-22 GB/s for a plain streaming dot-product kernel. So a few
// rows on CPU in fp32 take our own kernel; everything else (prefill, training, autograd, CUDA, bf16)
// is at::linear.
#pragma once

#include <ATen/ATen.h>

namespace archspace {

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight);

// Up to this many rows of x go through the streaming kernel (each weight block is read from memory once
// and reused from L1 for every row). bench_linear on the 190M shapes: the kernel is 1.2-2x faster than
// at::linear at 32 rows and even at 64, so decoding batches of up to 32 sequences (and short prefills)
// take it.
inline constexpr int64_t kStreamingLinearMaxRows = 32;

// Whether linear() would use the streaming kernel for x (exposed for tests and benchmarks).
bool uses_streaming_linear(const at::Tensor& x, const at::Tensor& weight);

// The streaming kernel itself, whatever the row count (for tests against at::linear).
at::Tensor streaming_linear(const at::Tensor& x, const at::Tensor& weight);

}  // namespace archspace
