#include "archspace/kernels/bf16_matmuls.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>

#include "archspace/kernels/cpu_isa.h"

namespace archspace {
namespace {

bool choose_widened() { return !(max_cpu_isa() == CpuIsa::kAvx512Bf16 && onednn_allows_native_bf16()); }

int policy_override = -1;  // -1: this CPU's choice; 0 or 1: a test's (ScopedBf16MatmulPolicy)

// Whether the ATen op on these operands would run a bf16 GEMM on the CPU: all of them bf16, or bf16 autocast on
// for the CPU and every floating operand one it casts (fp32 or bf16; it leaves fp64 alone).
bool runs_in_bf16(std::initializer_list<const at::Tensor*> operands) {
  const bool autocast =
      at::autocast::is_autocast_enabled(at::kCPU) && at::autocast::get_autocast_dtype(at::kCPU) == at::kBFloat16;
  for (const at::Tensor* t : operands) {
    if (!t->defined() || !t->is_cpu()) return false;
    const at::ScalarType s = t->scalar_type();
    if (!(s == at::kBFloat16 || (autocast && s == at::kFloat))) return false;
  }
  return true;
}

bool widen(std::initializer_list<const at::Tensor*> operands) {
  return bf16_matmuls_widened() && runs_in_bf16(operands);
}

// The operand as the bf16 GEMM reads it (autocast's rounding of an fp32 one), widened exactly to fp32.
at::Tensor widened(const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); }

}  // namespace

bool bf16_matmuls_widened() {
  static const bool widened = choose_widened();
  return policy_override < 0 ? widened : policy_override == 1;
}

bool bf16_linear_widened(const at::Tensor& x, const at::Tensor& weight) { return widen({&x, &weight}); }

std::string bf16_matmuls_line() {
  return bf16_matmuls_widened() ? "bf16 matmuls: widened to fp32 on this CPU (no AVX512-BF16/AMX)"
                                : "bf16 matmuls: native on this CPU";
}

ScopedBf16MatmulPolicy::ScopedBf16MatmulPolicy(bool widened) : previous_(policy_override) {
  policy_override = widened ? 1 : 0;
}
ScopedBf16MatmulPolicy::~ScopedBf16MatmulPolicy() { policy_override = previous_; }

namespace bf16_matmuls {

// Each widened op: autocast kept off inside (the casts are made here, as autocast would make them), the fp32
// op, its result rounded to bf16 once.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight) {
  if (!widen({&x, &weight})) return at::linear(x, weight);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return at::linear(widened(x), widened(weight)).to(at::kBFloat16);
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  if (!widen({&a, &b})) return at::mm(a, b);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return at::mm(widened(a), widened(b)).to(at::kBFloat16);
}

at::Tensor matmul(const at::Tensor& a, const at::Tensor& b) {
  if (!widen({&a, &b})) return at::matmul(a, b);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return at::matmul(widened(a), widened(b)).to(at::kBFloat16);
}

const at::Tensor& Operand::wide() const {
  if (!wide_.defined()) wide_ = widened(t_);
  return wide_;
}

at::Tensor linear(const at::Tensor& x, const Operand& weight) {
  if (!widen({&x, &weight.t_})) return at::linear(x, weight.t_);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return at::linear(widened(x), weight.wide()).to(at::kBFloat16);
}

at::Tensor mm(const at::Tensor& a, const Operand& b) {
  if (!widen({&a, &b.t_})) return at::mm(a, b.t_);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return at::mm(widened(a), b.wide()).to(at::kBFloat16);
}

at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const std::optional<at::Tensor>& mask, double dropout, bool is_causal,
                                        std::optional<double> scale, bool enable_gqa) {
  const bool float_mask = mask && mask->defined() && mask->is_floating_point();
  if (!widen({&q, &k, &v}) || (float_mask && !runs_in_bf16({&*mask})))
    return at::scaled_dot_product_attention(q, k, v, mask, dropout, is_causal, scale, enable_gqa);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const std::optional<at::Tensor> m = float_mask ? std::optional<at::Tensor>(widened(*mask)) : mask;
  return at::scaled_dot_product_attention(widened(q), widened(k), widened(v), m, dropout, is_causal, scale, enable_gqa)
      .to(at::kBFloat16);
}

}  // namespace bf16_matmuls
}  // namespace archspace
