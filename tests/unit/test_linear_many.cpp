// linear_many: the weights one x multiplies (q/k/v, gate/up) in one parallel region. Each result must equal the
// one-weight kernel's bit for bit on every kernel path and weight type (a row is computed the same way whichever
// thread and call computes it), whatever the matrices' row counts (tails at every boundary between them); and
// anything the streaming kernels do not take goes to linear() one weight at a time.
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <tuple>
#include <vector>

#include "../../src/kernels/streaming_gemv.h"
#include "archspace/kernels/cpu_isa.h"
#include "archspace/kernels/int8_weights.h"
#include "archspace/kernels/linear.h"
#include "test_support.h"

using namespace archspace;
using archspace::testing::runnable_paths;

namespace {
// Row counts with every remainder modulo the four-row block, large enough together that two or more threads
// split them (64 blocks a task at least) and a thread's rows run from one matrix into the next.
const std::vector<std::vector<int64_t>> kRowLists = {{768, 384, 384}, {5, 1027, 130}, {3, 257, 2}, {1030, 1031}};
}  // namespace

TEST(LinearMany, EachResultIsTheOneWeightKernelsBitForBit) {
  at::manual_seed(0);
  for (CpuIsa isa : runnable_paths()) {
    for (const auto& rows : kRowLists) {
      for (int64_t K : {17, 64}) {
        for (int64_t M : {1, 3}) {
          std::vector<at::Tensor> w32;
          for (int64_t N : rows) w32.push_back(at::randn({N, K}));
          const at::Tensor x = at::randn({M, 1, K});
          std::vector<at::Tensor> bf16, int8;
          for (const at::Tensor& w : w32) {
            bf16.push_back(w.to(at::kBFloat16));
            int8.push_back(quantize_int8_rows(w, "w"));
          }
          const std::string what = std::string(cpu_isa_name(isa)) + " K=" + std::to_string(K) +
                                   " M=" + std::to_string(M) + " first N=" + std::to_string(rows[0]);
          const auto fp32_many = streaming_linear_many(x, w32, isa);
          const auto bf16_many = streaming_linear_many(x.to(at::kBFloat16), bf16, isa);
          const auto int8_many = int8_streaming_linear_many(x, int8, isa);
          ASSERT_EQ(fp32_many.size(), rows.size());
          for (size_t i = 0; i < rows.size(); ++i) {
            EXPECT_EQ(fp32_many[i].sizes().vec(), (std::vector<int64_t>{M, 1, rows[i]})) << what;
            EXPECT_TRUE(at::equal(fp32_many[i], streaming_linear(x, w32[i], isa))) << what << " fp32 " << i;
            EXPECT_TRUE(at::equal(bf16_many[i], streaming_linear(x.to(at::kBFloat16), bf16[i], isa)))
                << what << " bf16 " << i;
            EXPECT_TRUE(at::equal(int8_many[i], int8_streaming_linear(x, int8[i], isa))) << what << " int8 " << i;
          }
        }
      }
    }
  }
}

TEST(LinearMany, WhatTheStreamingKernelsDoNotTakeGoesOneWeightAtATime) {
  at::manual_seed(1);
  const std::vector<at::Tensor> w = {at::randn({300, 32}), at::randn({200, 32})};
  // Autograd: at::linear's results, with gradients back to x.
  const at::Tensor x = at::randn({2, 32}).requires_grad_(true);
  const auto ys = linear_many(x, w);
  ASSERT_EQ(ys.size(), 2u);
  for (size_t i = 0; i < ys.size(); ++i) {
    EXPECT_TRUE(ys[i].requires_grad());
    EXPECT_TRUE(at::equal(ys[i], at::linear(x, w[i])));
  }
  // Many rows, and weights of two kinds: each as linear() computes it alone.
  const at::Tensor many_rows = at::randn({kStreamingLinearMaxRows + 1, 32});
  const at::NoGradGuard no_grad;
  for (const auto& [input, weights] :
       {std::pair{many_rows, w}, std::pair{x.detach(), std::vector<at::Tensor>{w[0], quantize_int8_rows(w[1], "w")}}}) {
    const auto got = linear_many(input, weights);
    for (size_t i = 0; i < weights.size(); ++i) EXPECT_TRUE(at::equal(got[i], archspace::linear(input, weights[i])));
  }
  // The decode path agrees with linear() on each weight, fp32 and int8.
  const at::Tensor one = at::randn({1, 32});
  const std::vector<at::Tensor> q = {quantize_int8_rows(w[0], "w"), quantize_int8_rows(w[1], "w")};
  for (const auto& weights : {w, q}) {
    const auto got = linear_many(one, weights);
    for (size_t i = 0; i < weights.size(); ++i) EXPECT_TRUE(at::equal(got[i], archspace::linear(one, weights[i])));
  }
}

TEST(LinearMany, RefusesWeightsOfAnotherWidth) {
  const at::Tensor x = at::randn({1, 32});
  EXPECT_THROW(streaming_linear_many(x, {at::randn({8, 32}), at::randn({8, 31})}), c10::Error);
  EXPECT_THROW(int8_streaming_linear_many(x, {quantize_int8_rows(at::randn({8, 31}), "w")}), Error);
}

#if defined(__x86_64__)
// The split over threads: every row of every matrix once, and `then` (the next matrix, whose first rows the thread
// prefetches while finishing) given exactly when the same call goes on with that matrix's first rows.
TEST(LinearMany, SplitCoversEveryRowOnceAndNamesTheMatrixAThreadGoesOnWith) {
  using streaming_gemv::for_feature_blocks;
  for (const auto& rows : kRowLists) {
    std::vector<std::vector<int>> seen;
    std::vector<std::vector<char>> W;
    std::vector<const void*> starts;
    for (int64_t N : rows) {
      seen.emplace_back(N, 0);
      W.emplace_back(1);
      starts.push_back(W.back().data());
    }
    std::mutex m;
    std::vector<std::tuple<size_t, int64_t, int64_t, const char*>> calls;
    for_feature_blocks(rows.data(), starts.data(), rows.size(),
                       [&](size_t i, int64_t n0, int64_t n1, const char* then) {
                         std::lock_guard<std::mutex> lock(m);
                         calls.emplace_back(i, n0, n1, then);
                         for (int64_t n = n0; n < n1; ++n) ++seen[i][n];
                       });
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t n = 0; n < rows[i]; ++n) ASSERT_EQ(seen[i][n], 1) << "matrix " << i << " row " << n;
    for (const auto& [i, n0, n1, then] : calls) {
      EXPECT_EQ(n0 % 4, 0);
      // Is there a call that starts matrix i + 1 right where this one ends, on the same thread? The split gives
      // each thread one contiguous run of blocks, so that call exists exactly when this one ends matrix i.
      const bool goes_on = std::any_of(calls.begin(), calls.end(), [&, i = i, n1 = n1](const auto& c) {
        return std::get<0>(c) == i + 1 && std::get<1>(c) == 0 && n1 == rows[i];
      });
      if (then) {
        EXPECT_EQ(n1, rows[i]);
        EXPECT_EQ(then, static_cast<const char*>(starts[i + 1]));
      }
      if (!goes_on) EXPECT_EQ(then, nullptr);
    }
  }
}
#endif
