// Greedy decoding's argmax over one row of logits, vectorised: ATen's argmax reduces a [V] row on one thread at
// ~0.25 G elements/s, which at batch 8 over a 100,278-id vocabulary costs as much as the model's decode step.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace archspace {

// The index of the largest of x[0..n), with at::argmax's rules: the first of equal maxima (-0 == +0), and a NaN
// counts as larger than everything (the first NaN wins). n >= 1. AVX2 where max_cpu_isa() allows, else scalar.
int64_t argmax_first(const float* x, int64_t n);

// argmax_first over a 1-D CPU tensor; other dtypes, devices or strides go to at::argmax.
int64_t argmax_index(const at::Tensor& logits);

// Logits as fp32 on the CPU, what sampling reads: a bf16 model's logits widened (exactly: a bf16 value is the high
// half of an fp32) by one plain loop, which costs a fraction of ATen's conversion for a decode step's [B, V] row
// (a dispatch, a parallel region, and its code fetched again after the step's weights have gone through the caches);
// anything else through Tensor::to.
at::Tensor logits_to_float(const at::Tensor& logits);

}  // namespace archspace
