#include "archspace/kernels/bf16_gemm.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "archspace/kernels/bf16_matmuls.h"
#include "archspace/kernels/cpu_isa.h"
#include "archspace/util/error.h"

// MKL's CBLAS (LP64: 32-bit MKL_INT), exported by libtorch_cpu.so on x86-64. Weak: a LibTorch without it
// leaves the pointer null and the fallback runs.
extern "C" void cblas_gemm_bf16bf16f32(int layout, int transa, int transb, int m, int n, int k, float alpha,
                                       const uint16_t* a, int lda, const uint16_t* b, int ldb, float beta, float* c,
                                       int ldc) __attribute__((weak));

namespace archspace {
namespace {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

// A row-major operand as CBLAS takes it: its data, whether it is stored transposed, and its leading dimension.
struct BlasOperand {
  const at::Tensor tensor;  // the tensor the pointer reads (a contiguous copy where the strides do not fit)
  int trans;
  int64_t ld;
};

BlasOperand blas_operand(const at::Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1);
  // A dimension of size 1 may carry any stride: it is never stepped over.
  if (t.stride(1) == 1 || cols == 1) {
    const int64_t ld = rows == 1 ? std::max<int64_t>(cols, 1) : t.stride(0);
    if (ld >= std::max<int64_t>(cols, 1)) return {t, kNoTrans, ld};
  }
  if (t.stride(0) == 1 || rows == 1) {
    const int64_t ld = cols == 1 ? std::max<int64_t>(rows, 1) : t.stride(1);
    if (ld >= std::max<int64_t>(rows, 1)) return {t, kTrans, ld};
  }
  const at::Tensor c = t.contiguous();
  return {c, kNoTrans, std::max<int64_t>(cols, 1)};
}

bool fits_int(int64_t v) { return v <= INT_MAX; }

}  // namespace

bool has_fp32_output_bf16_gemm() { return cblas_gemm_bf16bf16f32 != nullptr; }

namespace {
int choice_override = -1;  // -1: this CPU's answer; 0 or 1: a test's (ScopedFp32OutputBf16GemmChoice)
}  // namespace

bool fp32_output_bf16_gemm_is_fast() {
  static const bool fast = has_fp32_output_bf16_gemm() && cpu_has_amx_bf16() && kernel_isa() == CpuIsa::kAvx512Bf16;
  return choice_override < 0 ? fast : choice_override == 1 && has_fp32_output_bf16_gemm();
}

ScopedFp32OutputBf16GemmChoice::ScopedFp32OutputBf16GemmChoice(bool fast) : previous_(choice_override) {
  choice_override = fast ? 1 : 0;
}
ScopedFp32OutputBf16GemmChoice::~ScopedFp32OutputBf16GemmChoice() { choice_override = previous_; }

void bf16_matmul_into_fp32(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
  if (a.dim() != 2 || b.dim() != 2 || out.dim() != 2 || a.size(1) != b.size(0) || out.size(0) != a.size(0) ||
      out.size(1) != b.size(1)) {
    throw Error("bf16_matmul_into_fp32: shapes " + c10::str(a.sizes()) + " x " + c10::str(b.sizes()) + " into " +
                c10::str(out.sizes()) + " do not make a matrix product");
  }
  if (a.scalar_type() != at::kBFloat16 || b.scalar_type() != at::kBFloat16 || out.scalar_type() != at::kFloat ||
      !out.is_contiguous()) {
    throw Error(std::string("bf16_matmul_into_fp32: needs bf16 operands and a contiguous fp32 output, got ") +
                c10::toString(a.scalar_type()) + " x " + c10::toString(b.scalar_type()) + " into " +
                c10::toString(out.scalar_type()));
  }
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0) return;
  // The bf16 product, rounded, then widened: autocast's at::mm(a, b).to(kFloat).
  auto product_then_cast = [&] {
    if (accumulate)
      out.add_(bf16_matmuls::mm(a, b));
    else
      out.copy_(bf16_matmuls::mm(a, b));
  };
  const bool cpu = a.device().is_cpu() && b.device().is_cpu() && out.device().is_cpu();
  if (!cpu || !has_fp32_output_bf16_gemm() || k == 0 || !fits_int(m) || !fits_int(n) || !fits_int(k))
    return product_then_cast();
  const BlasOperand A = blas_operand(a), B = blas_operand(b);
  if (!fits_int(A.ld) || !fits_int(B.ld)) return product_then_cast();
  cblas_gemm_bf16bf16f32(kRowMajor, A.trans, B.trans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                         1.0f, reinterpret_cast<const uint16_t*>(A.tensor.data_ptr()), static_cast<int>(A.ld),
                         reinterpret_cast<const uint16_t*>(B.tensor.data_ptr()), static_cast<int>(B.ld),
                         accumulate ? 1.0f : 0.0f, out.data_ptr<float>(), static_cast<int>(n));
}

}  // namespace archspace
