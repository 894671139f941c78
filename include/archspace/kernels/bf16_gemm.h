// out (+)= a b for bf16 matrices with fp32 products, sums and output: one GEMM where autocast's
// at::mm(a, b).to(kFloat) writes a bf16 product (rounded to 2^-8), reads it back and writes the fp32 copy.
// The LM head's weight gradient is its user (model/loss.cpp): a [V, D] product per step, 77M of the 190M
// preset's 113M matmul weights, where the bf16 product and its cast cost a third of the GEMM's time.
//
// On the CPU: MKL's cblas_gemm_bf16bf16f32 from LibTorch's own MKL. LibTorch exports no ATen operator for it
// (aten::mm.dtype is CUDA-only in 2.11, at::native::mkldnn_matmul refuses an fp32 result); where its library
// lacks the symbol, and on other devices, the product goes through at::mm in bf16 and is cast, as before.
// MKL runs it on AMX tiles on Intel CPUs that have them; elsewhere on slower code (on an AMD EPYC with
// AVX512-BF16, 2.5x the time of oneDNN's bf16 at::mm on the LM head's gradient), hence the second question.
#pragma once

#include <ATen/ATen.h>

namespace archspace {

// Whether bf16_matmul_into_fp32 runs the fp32-output GEMM for CPU tensors (else the bf16 product and a cast).
bool has_fp32_output_bf16_gemm();

// Whether that GEMM is the faster way to a bf16 product's fp32 sum on this CPU: it has AMX-BF16 and the engine's
// kernels are not capped below AVX512-BF16 (ARCHSPACE_MAX_CPU_ISA, kernels/cpu_isa.h: a capped run takes the path of
// a CPU without AMX). Callers that only want speed ask this; the numerics of either path are stated where used.
bool fp32_output_bf16_gemm_is_fast();

// Tests: fp32_output_bf16_gemm_is_fast() answers `fast` (false where MKL lacks the GEMM) while this lives, so
// that a machine without AMX also runs its callers' AMX path, and one with AMX the other. Not thread-safe.
class ScopedFp32OutputBf16GemmChoice {
 public:
  explicit ScopedFp32OutputBf16GemmChoice(bool fast);
  ~ScopedFp32OutputBf16GemmChoice();
  ScopedFp32OutputBf16GemmChoice(const ScopedFp32OutputBf16GemmChoice&) = delete;
  ScopedFp32OutputBf16GemmChoice& operator=(const ScopedFp32OutputBf16GemmChoice&) = delete;

 private:
  int previous_;
};

// out = a b (accumulate = false) or out += a b (accumulate = true), for a [m, k] and b [k, n] bf16 on one
// device (any strides: transposed views go through as such) and out [m, n] fp32 contiguous. Each entry is
// the fp32 sum of exact bf16 x bf16 products (and of out's value when accumulating), in some order:
// within gamma(k + 1) = (k + 1) 2^-24 / (1 - (k + 1) 2^-24) of sum |a_ik b_kj| (+ |out_ij|) of the exact value.
void bf16_matmul_into_fp32(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate);

}  // namespace archspace
