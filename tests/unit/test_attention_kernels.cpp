// The CUDA attention path, tested on the CPU: which kernel a call takes (the dispatch rule, asked for a
// CUDA device without one), the arguments and layouts handed to the flash kernel (through a CPU stand-in
// that computes what the kernel is defined to compute from those arguments), and the Depth-Attention
// mix in bf16. tests/python/test_device_check.py runs the GPU-only rest's code path on the CPU;
// scripts/device-check.sh runs the real kernel against the reference on a GPU.
#include <gtest/gtest.h>

#include <limits>

#include "archspace/model/attention.h"
#include "archspace/model/depth_attention.h"
#include "tolerance.h"

using namespace archspace;

namespace {

AttentionPath path(at::Device device, at::ScalarType dtype, int64_t tq, int64_t tk, int64_t window,
                   int64_t q_offset = 0, bool padded = false, int64_t head_dim = 128,
                   AttentionImpl impl = AttentionImpl::kSdpa) {
  return attention_path(impl, device, dtype, tq, tk, head_dim, window, q_offset, padded);
}

}  // namespace

TEST(AttentionPath, FlashForWholeHalfPrecisionSequencesOnCuda) {
  const at::Device cuda(at::kCUDA, 0), cpu(at::kCPU);
  for (at::ScalarType half : {at::kBFloat16, at::kHalf}) {
    EXPECT_EQ(path(cuda, half, 8192, 8192, 0), AttentionPath::kFlash);     // full layer, training or prefill
    EXPECT_EQ(path(cuda, half, 8192, 8192, 4096), AttentionPath::kFlash);  // sliding layer: no mask blocks
    EXPECT_EQ(path(cuda, half, 100, 100, 4096), AttentionPath::kFlash);
  }
  // Elsewhere today's paths: fp32 on CUDA, any dtype on the CPU.
  EXPECT_EQ(path(cuda, at::kFloat, 8192, 8192, 0), AttentionPath::kSdpaCausal);
  EXPECT_EQ(path(cuda, at::kFloat, 8192, 8192, 4096), AttentionPath::kSdpaMasked);  // T <= 2 window: one mask
  EXPECT_EQ(path(cuda, at::kFloat, 65536, 65536, 4096), AttentionPath::kSdpaBlocked);
  EXPECT_EQ(path(cpu, at::kBFloat16, 65536, 65536, 4096), AttentionPath::kSdpaBlocked);
  EXPECT_EQ(path(cpu, at::kBFloat16, 6000, 6000, 4096), AttentionPath::kSdpaMasked);
  EXPECT_EQ(path(cpu, at::kBFloat16, 100, 100, 4096), AttentionPath::kSdpaCausal);
  // Decoding and later prefill chunks (queries offset into the cache), and left-padded batches, keep
  // today's path on CUDA too.
  EXPECT_EQ(path(cuda, at::kBFloat16, 1, 300, 0, 299), AttentionPath::kSdpaNoMask);
  EXPECT_EQ(path(cuda, at::kBFloat16, 1, 4096, 4096, 4095), AttentionPath::kSdpaNoMask);
  EXPECT_EQ(path(cuda, at::kBFloat16, 1024, 2048, 0, 1024), AttentionPath::kSdpaMasked);
  EXPECT_EQ(path(cuda, at::kBFloat16, 64, 64, 0, 0, /*padded=*/true), AttentionPath::kSdpaMasked);
  // Head sizes the kernel was not built for; the reference implementation when asked for.
  EXPECT_EQ(path(cuda, at::kBFloat16, 64, 64, 0, 0, false, /*head_dim=*/12), AttentionPath::kSdpaCausal);
  EXPECT_EQ(path(cuda, at::kBFloat16, 64, 64, 0, 0, false, /*head_dim=*/512), AttentionPath::kSdpaCausal);
  EXPECT_EQ(path(cuda, at::kBFloat16, 64, 64, 0, 0, false, 128, AttentionImpl::kReference), AttentionPath::kReference);
}

TEST(AttentionPath, CudnnAttentionIsOffAndTheOthersOn) {
  avoid_cudnn_attention();
  avoid_cudnn_attention();  // idempotent
  EXPECT_FALSE(at::globalContext().userEnabledCuDNNSDP());
  EXPECT_TRUE(at::globalContext().userEnabledFlashSDP());
  EXPECT_TRUE(at::globalContext().userEnabledMemEfficientSDP());
  EXPECT_TRUE(at::globalContext().userEnabledMathSDP());
}

TEST(FlashArguments, WindowCountsTheQueryItself) {
  const FlashArguments sliding = flash_arguments(4096, 128);
  EXPECT_FALSE(sliding.is_causal);
  EXPECT_EQ(sliding.window_left, 4095);  // keys i - 4095 .. i: 4096 positions, as causal_mask's window
  EXPECT_EQ(sliding.window_right, 0);
  EXPECT_DOUBLE_EQ(sliding.scale, 1.0 / std::sqrt(128.0));
  const FlashArguments full = flash_arguments(0, 64);
  EXPECT_TRUE(full.is_causal);
  EXPECT_EQ(full.window_left, -1);
  EXPECT_EQ(full.window_right, -1);
}

// The layouts ([B, H, T, h] <-> the kernel's [B, T, H, h]), GQA and the window arguments, through the
// stand-in, against the reference attention (its own mask from causal_mask): two fp32 computations, so
// within attention_bound (tolerance.h) of each other.
TEST(FlashAttention, StandInWithTheEnginesArgumentsEqualsTheReference) {
  at::manual_seed(0);
  const int64_t B = 2, H = 4, G = 2, T = 21, h = 16;
  for (int64_t window : {0, 1, 3, 8, 21, 50}) {
    at::Tensor q = at::randn({B, H, T, h}), k = at::randn({B, G, T, h}), v = at::randn({B, G, T, h});
    at::Tensor got = flash_causal_attention(q, k, v, window, /*cpu_stand_in=*/true);
    at::Tensor expected = causal_attention(q, k, v, window, 0, AttentionImpl::kReference);
    EXPECT_EQ(got.sizes(), expected.sizes());
    const int64_t keys = window > 0 ? std::min(window, T) : T;
    EXPECT_TRUE(tolerance::within(got, expected, tolerance::attention_bound(q, k, v, keys))) << "window " << window;
  }
}

// Gradients flow through the layout views into q, k and v as through the reference (the real kernel's
// backward is LibTorch's, given the same window: derivatives.yaml).
TEST(FlashAttention, StandInGradientsEqualTheReference) {
  at::manual_seed(1);
  const int64_t B = 1, H = 4, G = 2, T = 13, h = 8;
  at::Tensor q = at::randn({B, H, T, h}, at::kDouble), k = at::randn({B, G, T, h}, at::kDouble),
             v = at::randn({B, G, T, h}, at::kDouble);
  at::Tensor w = at::randn({B, H, T, h}, at::kDouble);
  std::vector<at::Tensor> grads[2];
  for (int which = 0; which < 2; ++which) {
    at::Tensor qq = q.clone().requires_grad_(true), kk = k.clone().requires_grad_(true),
               vv = v.clone().requires_grad_(true);
    at::Tensor out = which == 0 ? flash_causal_attention(qq, kk, vv, 5, true)
                                : causal_attention(qq, kk, vv, 5, 0, AttentionImpl::kReference);
    (out.to(at::kDouble) * w).sum().backward();
    grads[which] = {qq.grad(), kk.grad(), vv.grad()};
  }
  // The stand-in computes in fp32 (as the kernel accumulates): fp32 rounding of values of order 1.
  for (int i = 0; i < 3; ++i) EXPECT_LE((grads[0][i] - grads[1][i]).abs().max().item<double>(), 1e-5) << i;
}

// bf16 q, k and v: the stand-in returns bf16 as the kernel does, within bf16 rounding of the output
// (2^-8 relative: values of order 1 give <= ~8e-3) of the fp32 reference on the same bf16 inputs.
TEST(FlashAttention, Bf16OutputWithinBf16Rounding) {
  at::manual_seed(2);
  at::Tensor q = at::randn({1, 4, 30, 16}).to(at::kBFloat16), k = at::randn({1, 2, 30, 16}).to(at::kBFloat16),
             v = at::randn({1, 2, 30, 16}).to(at::kBFloat16);
  at::Tensor got = flash_causal_attention(q, k, v, 8, true);
  EXPECT_EQ(got.scalar_type(), at::kBFloat16);
  at::Tensor expected =
      causal_attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), 8, 0, AttentionImpl::kReference);
  EXPECT_LE((got.to(at::kFloat) - expected).abs().max().item<double>(), 8e-3);
}

// The Depth-Attention mix in bf16 (its softmax is computed in fp32: depth_attention.cpp promotes the
// scores) stays within bf16 rounding of the fp64 mix of the same bf16 inputs: scores of order 4 rounded
// to bf16 (+-0.016) move each weight by ~1.6%, the output (order 1-2) is rounded again (+-0.008); seen
// 1e-2 or less. 3e-2 still fails a mix that drops or mis-weights a source (errors of order 0.3).
TEST(DepthAttention, Bf16MixWithinBf16RoundingOfTheExactMix) {
  at::manual_seed(3);
  const int64_t B = 1, H = 4, G = 2, T = 9, h = 16;
  auto bf = [](at::Tensor t) { return t.to(at::kBFloat16); };
  at::Tensor q = bf(at::randn({B, H, T, h})), k = bf(at::randn({B, G, T, h})), v = bf(at::randn({B, G, T, h}));
  std::vector<at::Tensor> keys, values;
  for (int s = 0; s < 3; ++s) {
    keys.push_back(bf(at::randn({B, G, T, h})));
    values.push_back(bf(at::randn({B, G, T, h})));
  }
  at::Tensor got = depth_attention_mix(q, k, v, keys, values);
  EXPECT_EQ(got.scalar_type(), at::kBFloat16);
  auto d = [](const at::Tensor& t) { return t.to(at::kDouble); };
  std::vector<at::Tensor> dk, dv;
  for (int s = 0; s < 3; ++s) {
    dk.push_back(d(keys[s]));
    dv.push_back(d(values[s]));
  }
  at::Tensor exact = depth_attention_mix(d(q), d(k), d(v), dk, dv);
  const double err = (d(got) - exact).abs().max().item<double>();
  std::printf("bf16 Depth-Attention mix: max error %.3g (values of order %.2f)\n", err,
              exact.abs().max().item<double>());
  EXPECT_LE(err, 3e-2);
}
