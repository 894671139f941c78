// The bf16 matmul policy. Without AVX512-BF16 (or AMX), LibTorch's bf16 GEMMs on the CPU fall back to code
// 15x to 500x slower than its fp32 GEMM (oneDNN refuses bf16 below AVX512; ATen's own loops are scalar): the
// tiny stage 1 trained at 15 tokens/s in bf16 against 770 in fp32 on an AVX2 EPYC. There the engine's bf16
// matmuls widen their operands to fp32, run the fp32 GEMM and round the result to bf16 once: the arithmetic of
// a bf16 GEMM (a bf16 x bf16 product is exact in fp32, the sums fp32, one rounding at the end), in other
// summation orders. Autograd sees the casts, so each backward GEMM is widened and rounded the same way.
//
// The choice is made once per process from the CPU (kernels/cpu_isa.h: max_cpu_isa(), which ARCHSPACE_MAX_CPU_ISA
// caps) and from oneDNN's own cap (ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16 keeps its bf16 GEMM off), and
// stated once on stderr by the CLI at start-up (tools/main.cpp). With AVX512-BF16 nothing changes: these functions
// are the ATen ops. CUDA tensors always take the ATen ops.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <utility>

namespace archspace {

// Whether bf16 matmuls on this CPU are widened to fp32 (chosen once; a test's ScopedBf16MatmulPolicy aside).
bool bf16_matmuls_widened();
// The line the CLI states on stderr at start-up where widened: "bf16 matmuls: widened to fp32 on this CPU (no
// AVX512-BF16/AMX)" or native.
std::string bf16_matmuls_line();

// Whether bf16_matmuls::linear(x, weight) runs widened (kernels/dispatch.h names it so).
bool bf16_linear_widened(const at::Tensor& x, const at::Tensor& weight);

// For tests: the widened (true) or native (false) path within a scope, whatever the CPU.
class ScopedBf16MatmulPolicy {
 public:
  explicit ScopedBf16MatmulPolicy(bool widened);
  ~ScopedBf16MatmulPolicy();
  ScopedBf16MatmulPolicy(const ScopedBf16MatmulPolicy&) = delete;
  ScopedBf16MatmulPolicy& operator=(const ScopedBf16MatmulPolicy&) = delete;

 private:
  int previous_;
};

// The ATen ops of the same names under the policy: where the GEMM would run in bf16 on the CPU (bf16 operands,
// or fp32 ones under bf16 autocast, which rounds them to bf16 first), it runs widened as above.
namespace bf16_matmuls {
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight);
at::Tensor mm(const at::Tensor& a, const at::Tensor& b);

// An operand of many products (the LM head's weight against chunks of rows): where the products are widened, it
// is widened once, at its first widened product, instead of once per product (for the 190M's head, 77M values
// read and 308 MB written each time). Holds that fp32 copy while it lives; the ops below take it in place of
// the tensor, with the same results.
class Operand {
 public:
  explicit Operand(at::Tensor t) : t_(std::move(t)) {}
  const at::Tensor& tensor() const { return t_; }

 private:
  friend at::Tensor linear(const at::Tensor& x, const Operand& weight);
  friend at::Tensor mm(const at::Tensor& a, const Operand& b);
  const at::Tensor& wide() const;
  at::Tensor t_;
  mutable at::Tensor wide_;
};
at::Tensor linear(const at::Tensor& x, const Operand& weight);
at::Tensor mm(const at::Tensor& a, const Operand& b);
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b);
// The attention's two products (scores fp32 in both forms; the native kernel also rounds the probabilities to
// bf16 before their product with v, the widened form keeps them fp32: within the same bf16 bound).
at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const std::optional<at::Tensor>& mask, double dropout, bool is_causal,
                                        std::optional<double> scale, bool enable_gqa);
}  // namespace bf16_matmuls

}  // namespace archspace
