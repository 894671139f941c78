// The streaming decode kernel against at::linear, computed in fp64: every tail case (K not a multiple of
// 8, N not a multiple of 4, 1..8 rows), and the fallbacks that must keep autograd and large batches on
// at::linear.
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "archspace/model/linear.h"
#include "archspace/util/cpu_isa.h"
#include "tolerance.h"

using namespace archspace;

namespace {
// fp32 dot products of length K: the engine's and the reference's summation orders differ, so each may be
// off from the exact value by about K * eps * sum|w x|; bound by that with the fp64 result as truth.
void expect_close_to_fp64(const at::Tensor& got, const at::Tensor& x, const at::Tensor& w) {
  at::Tensor exact = at::linear(x.to(at::kDouble), w.to(at::kDouble));
  at::Tensor magnitude = at::linear(x.to(at::kDouble).abs(), w.to(at::kDouble).abs());
  const double eps = std::numeric_limits<float>::epsilon();
  at::Tensor bound = magnitude * (x.size(-1) * eps) + 1e-30;
  EXPECT_TRUE(((got.to(at::kDouble) - exact).abs() <= bound).all().item<bool>())
      << "max error " << (got.to(at::kDouble) - exact).abs().max().item<double>();
}
}  // namespace

TEST(StreamingLinear, MatchesFp64ForAllTailShapes) {
  at::manual_seed(0);
  for (int64_t K : {1, 7, 8, 24, 61, 768}) {
    for (int64_t N : {1, 3, 4, 5, 130, 1027}) {
      for (int64_t M : {1, 2, 5, 8}) {
        at::Tensor x = at::randn({M, K});
        at::Tensor w = at::randn({N, K});
        at::Tensor got = streaming_linear(x, w);
        ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{M, N}));
        expect_close_to_fp64(got, x, w);
        // and agrees with at::linear as closely as two fp32 orders can: each within gamma(K) |x||w|
        EXPECT_TRUE(tolerance::within(got, at::linear(x, w), 2 * tolerance::linear_bound(x, w)))
            << "M=" << M << " N=" << N << " K=" << K;
      }
    }
  }
}

TEST(StreamingLinear, KeepsLeadingDimensionsAndStridedInput) {
  at::manual_seed(1);
  at::Tensor w = at::randn({33, 40});
  at::Tensor x = at::randn({2, 40, 1}).transpose(1, 2);  // [2, 1, 40], not contiguous
  // The fast path needs AVX2 (and ARCHSPACE_MAX_CPU_ISA not below it); else at::linear serves.
  ASSERT_EQ(uses_streaming_linear(x, w), max_cpu_isa() >= CpuIsa::kAvx2);
  at::Tensor got = archspace::linear(x, w);
  ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{2, 1, 33}));
  expect_close_to_fp64(got, x, w);
}

TEST(StreamingLinear, OnlyForFewRowsWithoutAutograd) {
  const bool fast = max_cpu_isa() >= CpuIsa::kAvx2;  // the streaming kernel's one condition on the CPU
  std::printf("streaming linear: %s kernel\n", cpu_isa_name(max_cpu_isa()));
  at::Tensor w = at::randn({16, 32});
  EXPECT_EQ(uses_streaming_linear(at::randn({1, 1, 32}), w), fast);
  EXPECT_EQ(uses_streaming_linear(at::randn({kStreamingLinearMaxRows, 32}), w), fast);
  EXPECT_FALSE(uses_streaming_linear(at::randn({kStreamingLinearMaxRows + 1, 32}), w));
  EXPECT_FALSE(uses_streaming_linear(at::randn({1, 32}).to(at::kBFloat16), w.to(at::kBFloat16)));
  EXPECT_FALSE(uses_streaming_linear(at::randn({1, 32}, at::kDouble), w.to(at::kDouble)));
  // A weight that needs a gradient goes through at::linear, so training still backpropagates.
  at::Tensor trainable = w.clone().requires_grad_(true);
  EXPECT_FALSE(uses_streaming_linear(at::randn({1, 32}), trainable));
  at::Tensor y = archspace::linear(at::randn({1, 32}), trainable);
  y.sum().backward();
  ASSERT_TRUE(trainable.grad().defined());
  {
    at::AutoGradMode no_grad(false);  // evaluation of a trainable model takes the fast path
    EXPECT_EQ(uses_streaming_linear(at::randn({1, 32}), trainable), fast);
  }
}

// A row's result does not depend on the rows beside it: every row of x goes through the same sums in the same
// order (bit for bit), so a sequence decoded in a batch sees the logits it would see alone.
TEST(StreamingLinear, RowsAreBatchInvariantBitForBit) {
  at::manual_seed(3);
  for (int64_t K : {7, 64, 768}) {
    for (int64_t N : {5, 130}) {
      at::Tensor w = at::randn({N, K});
      for (int64_t M : {2, 3, 8, 9}) {
        at::Tensor x = at::randn({M, K});
        at::Tensor batched = streaming_linear(x, w);
        for (int64_t m = 0; m < M; ++m) {
          EXPECT_TRUE(at::equal(batched[m], streaming_linear(x.narrow(0, m, 1), w)[0]))
              << "row " << m << " of M=" << M << " N=" << N << " K=" << K;
        }
      }
    }
  }
}
