// Softmax cross-entropy over rows of logits on the CPU, one pass per row each way, reading the logits in the
// dtype the head's matmul produced (fp32, or bf16 under autocast) with fp32 arithmetic:
//
//   forward:  lse_i = log sum_j exp(x_ij) (max-subtracted), picked_i = x_i,t_i
//   backward: x_ij <- exp(x_ij - lse_i) (g_ce + g_z2 lse_i) - g_ce [j == t_i], in place, rounded once to the
//             logits' dtype
//
// which is the gradient of g_ce * sum_i (lse_i - picked_i) + (g_z2 / 2) * sum_i lse_i^2 (cross-entropy and
// z-loss sums) with respect to the logits. The ATen form of the same (model/loss.cpp's next_token_loss and its
// autograd) makes an fp32 copy of bf16 logits, a max and a subtraction, an exp, a sum, a gather, a zero-filled
// [n, V] for the gather's gradient and several elementwise passes in backward: about ten passes over [n, V].
// AVX2 (exp8 of cpu_elements, within 2^-22 of exp) or scalar (std::exp), chosen by max_cpu_isa(); rows in
// parallel. Non-finite logits give a non-finite lse (NaN where at::logsumexp would give inf).
#pragma once

#include <ATen/ATen.h>

#include "archspace/kernels/cpu_isa.h"

namespace archspace {

struct RowLogSumExp {
  at::Tensor lse, picked;  // fp32 [n]
};

// logits [n, V] on the CPU, fp32 or bf16, each row contiguous; targets int64 [n] in [0, V).
RowLogSumExp cross_entropy_rows(const at::Tensor& logits, const at::Tensor& targets, CpuIsa isa = max_cpu_isa());

// Overwrites `logits` with the gradient above; lse from cross_entropy_rows of the same logits.
void cross_entropy_grad_rows_(at::Tensor& logits, const at::Tensor& targets, const at::Tensor& lse, float g_ce,
                              float g_z2, CpuIsa isa = max_cpu_isa());

// Whether cross_entropy_rows can take these logits (CPU, fp32 or bf16, rows contiguous).
bool cross_entropy_rows_supported(const at::Tensor& logits);

}  // namespace archspace
