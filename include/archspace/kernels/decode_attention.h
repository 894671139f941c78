// Attention of one decoding query per (row, head) over its cached keys, for inference on the CPU. LibTorch's
// CPU SDPA (the flash kernel) costs 100-130 us per call even for 32 keys (its buffers and an OpenMP region per
// call) and its barriers degrade on a loaded machine; a decode step's attention is a few small dot products
// and one weighted sum per head, which this computes directly, on one thread unless the work is large.
#pragma once

#include <ATen/ATen.h>

#include "archspace/kernels/cpu_isa.h"

namespace archspace {

// Whether decode_attention may take the call: CPU, q [B, H, 1, D], k and v [B, G, Tk, D] (Tk >= 1, H a
// multiple of G), all fp32 or all bf16, each last dim contiguous (other strides free: the cache's narrowed
// views), `padding_mask` undefined or a CPU bool tensor broadcastable to [B, 1, 1, Tk], no gradient wanted.
bool uses_decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& padding_mask = {});

// softmax(scale q k^T, over the keys padding_mask allows) v per (b, h), query head h reading kv head
// h / (H / G): scores, softmax (max subtracted) and the weighted sum of values in fp32, masked keys
// contributing exactly 0, the result rounded once to q's dtype: [B, H, 1, D], contiguous. A row with no key
// allowed gives NaN, as the softmax of all -inf does. AVX2 when D is a multiple of 8 (a polynomial exp
// within 2 ulp of exp's value), else scalar (std::exp). Each (b, h) is computed alone, in the same order
// whatever the batch holds.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                            const at::Tensor& padding_mask = {}, CpuIsa isa = max_cpu_isa());

// The AVX2 path's exp on n floats (x[i] <= 88.3; below -87.33 it gives 0), in place; exposed for its test.
// Scalar std::exp where AVX2 is not available.
void decode_attention_exp(float* x, int64_t n, CpuIsa isa = max_cpu_isa());

}  // namespace archspace
