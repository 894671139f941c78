// kernels/bf16_gemm: bf16 x bf16 -> fp32 products against fp64, within the rounding bound of fp32 sums of exact
// products (every layout of the operands: plain, transposed views, row strides wider than a row, strides
// CBLAS cannot take), overwriting an output full of NaN and accumulating into one; the same bits twice; and
// tight enough that autocast's bf16 product, cast afterwards, fails it.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "archspace/kernels/bf16_gemm.h"
#include "archspace/util/error.h"

namespace archspace {
namespace {

// An [r, c] bf16 matrix of random values in one of the layouts a caller hands over.
enum class Layout { kContiguous, kTransposedView, kWideRows, kColumnStep };

at::Tensor matrix(int64_t r, int64_t c, Layout layout) {
  switch (layout) {
    case Layout::kContiguous:
      return at::randn({r, c}).to(at::kBFloat16);
    case Layout::kTransposedView:
      return at::randn({c, r}).to(at::kBFloat16).t();
    case Layout::kWideRows:  // a column slice: rows 5 elements longer than the matrix's
      return at::randn({r, c + 5}).to(at::kBFloat16).narrow(1, 2, c);
    case Layout::kColumnStep:  // every other column: no unit stride, copied first
      return at::randn({r, 2 * c}).to(at::kBFloat16).slice(1, 0, 2 * c, 2);
  }
  return {};
}

const char* name(Layout l) {
  static const char* names[] = {"contiguous", "transposed", "wide rows", "column step"};
  return names[static_cast<int>(l)];
}

// Each fp32 sum of k exact products (bf16 x bf16 fits fp32's 24-bit significand) and of the initial value when
// accumulating is within gamma(k + 1) of the sum of the magnitudes, in any order of additions; flushing
// denormal results (AMX does) adds at most 2^-126 per addition.
at::Tensor bound(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c0) {
  const int64_t k = a.size(1);
  const double u = 0x1p-24, gamma = (k + 1) * u / (1 - (k + 1) * u);
  at::Tensor magnitude = at::mm(a.to(at::kDouble).abs(), b.to(at::kDouble).abs());
  if (c0.defined()) magnitude += c0.to(at::kDouble).abs();
  return gamma * magnitude + (k + 1) * 0x1p-126;
}

TEST(Bf16Gemm, WithinTheFp32SumBoundForEveryLayout) {
  std::printf("fp32-output GEMM from MKL: %s; the LM head's weight gradient takes it: %s\n",
              has_fp32_output_bf16_gemm() ? "yes" : "no (bf16 product + cast)",
              fp32_output_bf16_gemm_is_fast() ? "yes (AMX)" : "no");
  at::manual_seed(11);
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1}, {3, 5, 7}, {37, 129, 65}, {64, 512, 96}};
  const Layout layouts[] = {Layout::kContiguous, Layout::kTransposedView, Layout::kWideRows, Layout::kColumnStep};
  for (const auto& [m, k, n] : shapes)
    for (Layout la : layouts)
      for (Layout lb : layouts)
        for (bool accumulate : {false, true}) {
          const at::Tensor a = matrix(m, k, la), b = matrix(k, n, lb);
          const at::Tensor c0 = accumulate ? at::randn({m, n}) * 10 : at::Tensor();
          at::Tensor out = accumulate ? c0.clone() : at::full({m, n}, NAN);  // beta = 0 must not read it
          bf16_matmul_into_fp32(out, a, b, accumulate);
          at::Tensor exact = at::mm(a.to(at::kDouble), b.to(at::kDouble));
          if (accumulate) exact += c0.to(at::kDouble);
          const at::Tensor error = (out.to(at::kDouble) - exact).abs();
          const std::string what = std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) + " " +
                                   name(la) + " x " + name(lb) + (accumulate ? " accumulating" : "");
          ASSERT_TRUE(at::isfinite(out).all().item<bool>()) << what;
          EXPECT_TRUE((error <= bound(a, b, c0)).all().item<bool>())
              << what << ": worst error / bound " << (error / bound(a, b, c0)).max().item<double>();
        }
}

// The bound is one autocast's bf16-rounded product breaks (2^-8 relative), so the check above tells an fp32
// output from a widened bf16 one; and the GEMM gives the same bits on the same operands.
TEST(Bf16Gemm, TighterThanABf16ProductAndDeterministic) {
  if (!has_fp32_output_bf16_gemm()) GTEST_SKIP() << "this LibTorch exports no cblas_gemm_bf16bf16f32";
  at::manual_seed(12);
  const at::Tensor a = matrix(64, 512, Layout::kTransposedView), b = matrix(512, 96, Layout::kContiguous);
  const at::Tensor exact = at::mm(a.to(at::kDouble), b.to(at::kDouble)), limit = bound(a, b, at::Tensor());
  const at::Tensor widened = at::mm(a, b).to(at::kFloat);
  const double bf16_over = ((widened.to(at::kDouble) - exact).abs() / limit).max().item<double>();
  std::printf("autocast's bf16 product: worst error %.0fx the fp32 bound\n", bf16_over);
  EXPECT_GT(bf16_over, 1.0);
  at::Tensor first = at::empty({64, 96}), second = at::empty({64, 96});
  bf16_matmul_into_fp32(first, a, b, false);
  bf16_matmul_into_fp32(second, a, b, false);
  EXPECT_TRUE(at::equal(first, second));
}

TEST(Bf16Gemm, RejectsWhatIsNotABf16ProductIntoFp32) {
  const at::Tensor a = at::randn({4, 3}).to(at::kBFloat16), b = at::randn({3, 5}).to(at::kBFloat16);
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  at::Tensor out = at::empty({4, 5});
  EXPECT_NE(message([&] { bf16_matmul_into_fp32(out, a, a, false); }).find("[4, 3] x [4, 3]"), std::string::npos);
  at::Tensor half = at::empty({4, 5}, at::kBFloat16);
  EXPECT_NE(message([&] { bf16_matmul_into_fp32(half, a, b, false); }).find("contiguous fp32 output"),
            std::string::npos);
  at::Tensor fp32_operands = at::empty({4, 5});
  EXPECT_NE(message([&] { bf16_matmul_into_fp32(fp32_operands, a.to(at::kFloat), b, false); }).find("bf16 operands"),
            std::string::npos);
  at::Tensor strided = at::empty({5, 4}).t();
  EXPECT_NE(message([&] { bf16_matmul_into_fp32(strided, a, b, false); }).find("contiguous"), std::string::npos);
}

}  // namespace
}  // namespace archspace
