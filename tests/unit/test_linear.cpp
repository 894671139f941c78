// The streaming decode kernel against at::linear, computed in fp64: every tail case (K not a multiple of
// 8, N not a multiple of 4, 1..8 rows), and the fallbacks that must keep autograd and large batches on
// at::linear.
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "archspace/kernels/cpu_isa.h"
#include "archspace/kernels/linear.h"
#include "test_support.h"
#include "tolerance.h"

using namespace archspace;

namespace {
using archspace::testing::runnable_paths;

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

// Every tail on every path this CPU runs: K below, at and off the 8 (AVX2) and 16 (AVX512) lane counts, N off
// the 4-row blocks, M off the AVX512 kernel's 4-row blocks.
TEST(StreamingLinear, MatchesFp64ForAllTailShapes) {
  at::manual_seed(0);
  for (CpuIsa isa : runnable_paths()) {
    for (int64_t K : {1, 7, 8, 15, 16, 17, 24, 61, 64, 768}) {
      for (int64_t N : {1, 3, 4, 5, 130, 1027}) {
        for (int64_t M : {1, 2, 5, 8}) {
          at::Tensor x = at::randn({M, K});
          at::Tensor w = at::randn({N, K});
          at::Tensor got = streaming_linear(x, w, isa);
          ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{M, N}));
          expect_close_to_fp64(got, x, w);
          // and agrees with at::linear as closely as two fp32 orders can: each within gamma(K) |x||w|
          EXPECT_TRUE(tolerance::within(got, at::linear(x, w), 2 * tolerance::linear_bound(x, w)))
              << cpu_isa_name(isa) << " M=" << M << " N=" << N << " K=" << K;
        }
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
  EXPECT_EQ(uses_streaming_linear(at::randn({1, 32}).to(at::kBFloat16), w.to(at::kBFloat16)), fast);
  // bf16 weights stop at fewer rows: at::linear's bf16 GEMM catches up with the kernel sooner (linear.h)
  EXPECT_EQ(uses_streaming_linear(at::randn({kStreamingLinearMaxRowsBf16, 32}).to(at::kBFloat16), w.to(at::kBFloat16)),
            fast);
  EXPECT_FALSE(
      uses_streaming_linear(at::randn({kStreamingLinearMaxRowsBf16 + 1, 32}).to(at::kBFloat16), w.to(at::kBFloat16)));
  EXPECT_FALSE(uses_streaming_linear(at::randn({1, 32}), w.to(at::kBFloat16)));  // mixed dtypes: at::linear
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
  for (CpuIsa isa : runnable_paths()) {
    for (int64_t K : {7, 17, 64, 768}) {
      for (int64_t N : {5, 130}) {
        at::Tensor w = at::randn({N, K});
        for (int64_t M : {2, 3, 4, 5, 8, 9}) {
          at::Tensor x = at::randn({M, K});
          at::Tensor batched = streaming_linear(x, w, isa);
          for (int64_t m = 0; m < M; ++m) {
            EXPECT_TRUE(at::equal(batched[m], streaming_linear(x.narrow(0, m, 1), w, isa)[0]))
                << cpu_isa_name(isa) << " row " << m << " of M=" << M << " N=" << N << " K=" << K;
          }
        }
      }
    }
  }
}

namespace {
// bf16 in, bf16 out: the inputs are exact bf16 values, so the fp64 product is the truth. The kernel's fp32
// sums are off by at most K * eps32 * sum|w x| (as in fp32), then the one rounding to bf16 adds at most half
// an ulp of bf16, 2^-8 relative, of the rounded value.
at::Tensor bf16_bound(const at::Tensor& x, const at::Tensor& w) {
  at::Tensor exact = at::linear(x.to(at::kDouble), w.to(at::kDouble));
  at::Tensor magnitude = at::linear(x.to(at::kDouble).abs(), w.to(at::kDouble).abs());
  const double eps32 = std::numeric_limits<float>::epsilon(), u16 = std::ldexp(1.0, -8);
  at::Tensor sums = magnitude * (x.size(-1) * eps32);
  return sums + (exact.abs() + sums) * u16 + 1e-30;
}

void expect_bf16_close_to_fp64(const at::Tensor& got, const at::Tensor& x, const at::Tensor& w,
                               const std::string& what) {
  ASSERT_EQ(got.scalar_type(), at::kBFloat16) << what;
  at::Tensor err = (got.to(at::kDouble) - at::linear(x.to(at::kDouble), w.to(at::kDouble))).abs();
  at::Tensor bound = bf16_bound(x, w);
  EXPECT_TRUE((err <= bound).all().item<bool>()) << what << ": max error/bound " << (err / bound).max().item<double>();
}
}  // namespace

// Every tail: K below, at and off the 8 (AVX2) and 32 (AVX512-BF16) lane counts, N off the 4-row blocks and (one row
// of x, AVX512-BF16) the 8-row ones: 12 and 13 leave a 4-row block and a single row after them; M off the passes
// over 4 (AVX512-BF16), 2 and 1 rows of x: 5 = 4 + 1, 7 = 4 + 2 + 1.
TEST(StreamingLinearBf16, MatchesFp64ForAllTailShapesOnEveryPath) {
  at::manual_seed(4);
  for (CpuIsa isa : runnable_paths()) {
    for (int64_t K : {1, 7, 8, 31, 32, 33, 61, 768}) {
      for (int64_t N : {1, 3, 4, 5, 12, 13, 130}) {
        for (int64_t M : {1, 2, 3, 4, 5, 7}) {
          at::Tensor x = at::randn({M, K}).to(at::kBFloat16);
          at::Tensor w = at::randn({N, K}).to(at::kBFloat16);
          const std::string what = std::string(cpu_isa_name(isa)) + " M=" + std::to_string(M) +
                                   " N=" + std::to_string(N) + " K=" + std::to_string(K);
          at::Tensor got = streaming_linear(x, w, isa);
          ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{M, N})) << what;
          expect_bf16_close_to_fp64(got, x, w, what);
          // at::linear's bf16 GEMM (fp32 sums, one bf16 rounding) obeys the same bound, so the two differ by
          // at most twice it
          at::Tensor diff = (got.to(at::kDouble) - at::linear(x, w).to(at::kDouble)).abs();
          EXPECT_TRUE((diff <= 2 * bf16_bound(x, w)).all().item<bool>()) << what;
        }
      }
    }
  }
}

// The paths differ only in the order of their fp32 sums: with sums of exactly representable values (small
// integers, whose every partial sum is exact in fp32) they agree bit for bit, which catches a lane or row
// the vector paths drop or double.
TEST(StreamingLinearBf16, PathsAgreeExactlyOnExactSums) {
  at::manual_seed(5);
  at::Tensor x = at::randint(-8, 9, {7, 100}).to(at::kBFloat16);  // passes over 4, 2 and 1 rows of x
  at::Tensor w = at::randint(-8, 9, {37, 100}).to(at::kBFloat16);
  // |sums| <= 100 * 64 < 2^13: exact in fp32, and in bf16 when below 2^8; compared against the rounding of the
  // exact sum, made once
  const at::Tensor want = at::linear(x.to(at::kDouble), w.to(at::kDouble)).to(at::kBFloat16);
  // Every result stays allocated and no temporary holds the answer: a path that skipped an output would otherwise
  // find a right answer in reused memory.
  std::vector<at::Tensor> kept;
  for (CpuIsa isa : runnable_paths()) {
    kept.push_back(streaming_linear(x, w, isa));
    EXPECT_TRUE(at::equal(kept.back(), want)) << cpu_isa_name(isa);
    // one row of x: the AVX512-BF16 kernel's 8-row blocks (37 = 4 x 8 + 4 + 1)
    kept.push_back(streaming_linear(x.narrow(0, 1, 1), w, isa));
    EXPECT_TRUE(at::equal(kept.back(), want.narrow(0, 1, 1))) << cpu_isa_name(isa);
  }
}

TEST(StreamingLinearBf16, RowsAreBatchInvariantBitForBit) {
  at::manual_seed(6);
  for (CpuIsa isa : runnable_paths()) {
    for (int64_t K : {7, 64, 100}) {
      // 141 rows: one row of x takes 8-row blocks, a 4-row one and a single row; a batch, 4-row blocks against
      // 4, 2 and 1 rows of x a pass
      at::Tensor w = at::randn({141, K}).to(at::kBFloat16);
      for (int64_t M : {2, 3, 7, 8}) {
        at::Tensor x = at::randn({M, K}).to(at::kBFloat16);
        at::Tensor batched = streaming_linear(x, w, isa);
        for (int64_t m = 0; m < M; ++m)
          EXPECT_TRUE(at::equal(batched[m], streaming_linear(x.narrow(0, m, 1), w, isa)[0]))
              << cpu_isa_name(isa) << " row " << m << " of M=" << M << " K=" << K;
      }
    }
  }
}

TEST(StreamingLinearBf16, LinearTakesItForFewRowsWithoutAutograd) {
  at::Tensor w = at::randn({33, 40}).to(at::kBFloat16);
  at::Tensor x = at::randn({2, 1, 40}).to(at::kBFloat16);
  EXPECT_EQ(uses_streaming_linear(x, w), max_cpu_isa() >= CpuIsa::kAvx2);
  at::Tensor got = archspace::linear(x, w);
  ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{2, 1, 33}));
  expect_bf16_close_to_fp64(got.view({2, 33}), x.view({2, 40}), w, "linear()");
  EXPECT_THROW(streaming_linear(x, w.to(at::kFloat)), c10::Error);
}
