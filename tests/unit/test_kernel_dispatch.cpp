// kernels/dispatch.h's rule, listed: for each op the model runs through kernels/, the implementation it names for
// decoding, prefill and training operands under each of the run's choices, on this kernel path (make kernel-paths
// runs it again under scripts/kernel_paths.sh avx2 and baseline: ARCHSPACE_MAX_CPU_ISA caps the engine's kernels and
// ONEDNN_MAX_CPU_ISA the bf16 GEMMs). Each row's expectation is the rule as its headers state it, with the ISA and
// the bf16 matmul policy read from this process; the table is printed, so a run's log says what ran where.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "archspace/kernels/bf16_matmuls.h"
#include "archspace/kernels/cpu_isa.h"
#include "archspace/kernels/dispatch.h"
#include "archspace/kernels/int8_weights.h"
#include "archspace/kernels/linear.h"
#include "archspace/model/forward_options.h"

namespace archspace {
namespace {

struct Row {
  std::string op, operands;
  Kernel chosen, expected;
};

void expect_rows(const std::vector<Row>& rows) {
  std::printf("kernel path: engine %s, bf16 GEMMs %s\n", cpu_isa_name(max_cpu_isa()),
              bf16_matmuls_widened() ? "widened" : "native");
  for (const Row& r : rows) {
    std::printf("  %-14s %-40s %s\n", r.op.c_str(), r.operands.c_str(), kernel_name(r.chosen));
    EXPECT_EQ(kernel_name(r.chosen), std::string(kernel_name(r.expected))) << r.op << " " << r.operands;
  }
}

at::Tensor trained(const at::Tensor& t) { return t.clone().requires_grad_(true); }

TEST(KernelDispatch, ListsTheKernelOfEveryOpOnThisPath) {
  const bool gemv = max_cpu_isa() >= CpuIsa::kAvx2;  // the streaming GEMVs need AVX2 with FMA
  const Kernel bf16_gemm = bf16_matmuls_widened() ? Kernel::kBf16Widened : Kernel::kAtenLinear;
  const KernelChoices none, fused{true, false}, fp8{false, true};
  const int64_t d = 64, width = 4 * d;
  const at::Tensor w = at::randn({width, d}), wb = w.to(at::kBFloat16), wq = quantize_int8_rows(w, "w");
  const at::Tensor x1 = at::randn({1, 1, d}), x256 = at::randn({1, 256, d});
  const at::Tensor norm_w = at::ones({d}), cos = at::ones({8, 16}), sin = at::zeros({8, 16});
  const at::Tensor h = at::randn({2, 8, 4 * 16}), hb = h.to(at::kBFloat16);
  const at::Tensor q = at::randn({2, 4, 1, 16}), k = at::randn({2, 2, 9, 16}), v = at::randn({2, 2, 9, 16});
  std::vector<Row> rows = {
      {"linear", "fp32, decoding (1 row)", linear_kernel(x1, w, none),
       gemv ? Kernel::kStreamingGemv : Kernel::kAtenLinear},
      {"linear", "bf16, decoding (1 row)", linear_kernel(x1.to(at::kBFloat16), wb, none),
       gemv ? Kernel::kStreamingGemv : bf16_gemm},
      {"linear", "int8 weights, fp32 x, decoding", linear_kernel(x1, wq, none), Kernel::kInt8StreamingGemv},
      {"linear", "int8 weights, bf16 x, decoding", linear_kernel(x1.to(at::kBFloat16), wq, none),
       Kernel::kInt8StreamingGemv},
      {"linear", "fp32, prefill (256 rows)", linear_kernel(x256, w, none), Kernel::kAtenLinear},
      {"linear", "bf16, prefill (256 rows)", linear_kernel(x256.to(at::kBFloat16), wb, none), bf16_gemm},
      {"linear", "int8 weights, prefill", linear_kernel(x256, wq, none), Kernel::kInt8WidenedGemm},
      {"linear", "fp32, training (x needs its grad)", linear_kernel(trained(x1), w, none), Kernel::kAtenLinear},
      {"linear", "train.fp8, training", linear_kernel(trained(x256), w, fp8), Kernel::kFp8ScaledMm},
      {"linear", "train.fp8, int8 weights", linear_kernel(x1, wq, fp8), Kernel::kInt8StreamingGemv},
      {"linear_many", "fp32 q/k/v, decoding", linear_many_kernel(x1, {w, w, w}, none),
       gemv ? Kernel::kStreamingGemv : Kernel::kAtenLinear},
      {"linear_many", "int8 gate/up, decoding", linear_many_kernel(x1, {wq, wq}, none), Kernel::kInt8StreamingGemv},
      {"linear_many", "fp32 and int8 weights, decoding", linear_many_kernel(x1, {w, wq}, none), Kernel::kAtenLinear},
      {"linear_many", "fp32, prefill", linear_many_kernel(x256, {w, w}, none), Kernel::kAtenLinear},
      {"linear_many", "train.fp8, training", linear_many_kernel(trained(x256), {w, w}, fp8), Kernel::kFp8ScaledMm},
      {"rms_norm", "fp32, inference", rms_norm_kernel(x1, norm_w, none), Kernel::kFusedInference},
      {"rms_norm", "bf16, inference", rms_norm_kernel(x1.to(at::kBFloat16), norm_w, fused), Kernel::kFusedInference},
      {"rms_norm", "training", rms_norm_kernel(trained(x1), norm_w, none), Kernel::kAtenComposite},
      {"rms_norm", "training, train.fused_kernels", rms_norm_kernel(trained(x1), norm_w, fused),
       Kernel::kFusedTrainingCpu},
      {"rms_norm", "fp64 (gradient checks), fused", rms_norm_kernel(trained(x1.to(at::kDouble)), norm_w, fused),
       Kernel::kAtenComposite},
      {"add_rms_norm", "inference", add_rms_norm_kernel(x1.clone(), x1, norm_w, none), Kernel::kFusedInference},
      {"add_rms_norm", "training", add_rms_norm_kernel(trained(x1), trained(x1), norm_w, none), Kernel::kAtenComposite},
      {"add_rms_norm", "training, train.fused_kernels", add_rms_norm_kernel(trained(x1), trained(x1), norm_w, fused),
       Kernel::kFusedTrainingCpu},
      {"rms_norm_rope", "inference", rms_norm_rope_kernel(h, at::ones({64}), cos, sin, 16, none),
       Kernel::kFusedInference},
      {"rms_norm_rope", "training", rms_norm_rope_kernel(trained(h), at::ones({64}), cos, sin, 16, none),
       Kernel::kAtenComposite},
      {"rms_norm_rope", "training, train.fused_kernels",
       rms_norm_rope_kernel(trained(hb), at::ones({64}), cos, sin, 16, fused), Kernel::kFusedTrainingCpu},
      {"rope", "inference", rope_kernel(h.view({2, 8, 4, 16}).transpose(1, 2), cos, sin), Kernel::kFusedInference},
      {"rope", "training", rope_kernel(trained(h).view({2, 8, 4, 16}).transpose(1, 2), cos, sin),
       Kernel::kAtenComposite},
      {"swiglu", "training", swiglu_kernel(trained(x256), trained(x256), none), Kernel::kAtenComposite},
      {"swiglu", "training, train.fused_kernels", swiglu_kernel(trained(x256), trained(x256), fused),
       Kernel::kFusedTrainingCpu},
      {"decode_attn", "fp32, one query per row", decode_attention_kernel(q, k, v), Kernel::kDecodeAttention},
      {"decode_attn", "with gradients", decode_attention_kernel(trained(q), k, v), Kernel::kAtenSdpa},
  };
  expect_rows(rows);
}

// The choices travel with the forward: SequenceOptions carries them, the other modes run none.
TEST(KernelDispatch, TheRunsChoicesAreTheForwardsNotTheProcesss) {
  SequenceOptions training;
  training.fused_kernels = true;
  training.fp8 = true;
  const KernelChoices chosen = ForwardMode(training).kernels();
  EXPECT_TRUE(chosen.fused);
  EXPECT_TRUE(chosen.fp8);
  EXPECT_FALSE(ForwardMode(SequenceOptions{}).kernels().fused);
  EXPECT_FALSE(ForwardMode(AnalysisOptions{}).kernels().fp8);
  // Two forwards' choices side by side: neither changes the other's kernels.
  const at::Tensor x = at::randn({1, 2, 8}).requires_grad_(true), w = at::ones({8});
  EXPECT_EQ(rms_norm_kernel(x, w, chosen), Kernel::kFusedTrainingCpu);
  EXPECT_EQ(rms_norm_kernel(x, w, ForwardMode(SequenceOptions{}).kernels()), Kernel::kAtenComposite);
}

}  // namespace
}  // namespace archspace
