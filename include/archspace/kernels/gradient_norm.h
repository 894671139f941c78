// Gradient norms for clipping and tracking: sums of squares accumulated in fp64 in an order fixed by the tensor
// alone (not by threads or the CPU's kernels), and the clip scaling, both able to visit only the rows that can
// be nonzero. The embedding's gradient in one process (train/embedding_gradient.h) is nonzero only in the rows
// the step looked up (a few hundred of 100,278 in a small model's step): reading the other rows to add zeros
// was the largest part of clipping.
//
// The order: a tensor is read as rows (its last dimension; a 1-D tensor as chunks of kFlatRow elements); in
// a row, element j's exact fp64 square (a float's square fits in fp64's 53 bits) goes to accumulator j mod 16,
// and the 16 are summed by a fixed tree; the rows' sums add in row order. A row of zeros sums to +0, and adding
// +0 changes no sum, so skipping rows that hold only zeros gives the dense result bit for bit. The AVX2 and
// scalar kernels follow the same order (the same results on every kernel path).
#pragma once

#include <ATen/ATen.h>

#include "archspace/kernels/cpu_isa.h"

namespace archspace {

// Elements per row of a 1-D tensor (the flat shards of FSDP).
constexpr int64_t kFlatRow = 4096;

// The sum of the squares of `t`'s elements, in fp64 (a 0-d tensor on t's device: no host sync on a GPU).
// `nonzero_rows` (int64, CPU, sorted, distinct), when given, lists every row of `t` that may hold a nonzero
// element; the others are not read. fp32 CPU tensors take the kernel above; other dtypes and devices are
// widened to fp64 and summed by ATen.
at::Tensor sum_of_squares(const at::Tensor& t, const at::Tensor& nonzero_rows = {});

// t *= coef in fp32, as clip_grad_norm_'s mul_ by its fp32 coefficient; only `nonzero_rows` when given (the
// others hold zeros, which stay zeros), and nothing at all when coef is 1.
void scale_gradient(at::Tensor& t, float coef, const at::Tensor& nonzero_rows = {});

// clip_grad_norm_'s coefficient min(1, max_norm / (norm + 1e-6)), formed in fp32 from the fp32 norm as it
// forms it (NaN stays NaN).
float clip_coefficient(float total_norm, double max_norm);

// One row's sum of squares in the order above by the kernel for `isa` (scalar where the CPU lacks it): for the
// tests, which show that the kernels agree bit for bit.
double row_sum_of_squares(const float* x, int64_t n, CpuIsa isa);

}  // namespace archspace
