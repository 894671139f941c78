// Gradient norms for clipping (kernels/gradient_norm.h): fp64 sums of squares within fp64's rounding of the exact
// value, in an order that depends on the tensor alone (the same with 1 or 2 threads, on the AVX2 and scalar
// kernels), so that reading only the rows that may be nonzero gives the dense sum bit for bit; the clip
// scaling equal to ATen's mul_ by the fp32 coefficient; clip_grad_norm against torch's clip_grad_norm_.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>

#include "archspace/kernels/gradient_norm.h"
#include "archspace/train/optimizer.h"
#include "tolerance.h"

namespace archspace {
namespace {

// fp64's unit roundoff.
constexpr double kFp64Unit = 0x1p-53;

// Tensors whose shapes cover rows shorter than, equal to and not a multiple of the 16 accumulators, and 1-D
// tensors of one and of several kFlatRow chunks (the last one short).
std::vector<at::Tensor> shapes_to_test() {
  at::manual_seed(3);
  std::vector<at::Tensor> out;
  for (auto shape : {std::vector<int64_t>{7}, {5, 3}, {33, 16}, {9, 45}, {4, 6, 768}, {3 * kFlatRow + 77}})
    out.push_back(at::randn(shape) * 1e3);
  return out;
}

TEST(GradientNorm, SumOfSquaresWithinFp64RoundingOfTheExactValue) {
  for (const at::Tensor& t : shapes_to_test()) {
    const double got = sum_of_squares(t).item<double>();
    // Each square is exact in fp64 (24 + 24 bits < 53); the reference's own sum and ours each add at most
    // numel roundings of the running sums (all terms positive): |error| <= numel u sum.
    const double reference = t.to(at::kDouble).square().sum().item<double>();
    EXPECT_NEAR(got, reference, 2 * static_cast<double>(t.numel()) * kFp64Unit * reference) << t.sizes();
  }
}

TEST(GradientNorm, TheOrderDependsOnTheTensorAlone) {
  for (const at::Tensor& t : shapes_to_test()) {
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    const double one = sum_of_squares(t).item<double>();
    at::set_num_threads(std::max(2, threads));
    const double two = sum_of_squares(t).item<double>();
    at::set_num_threads(threads);
    EXPECT_EQ(one, two) << t.sizes();
    // The AVX2 kernel (where this CPU has it) and the scalar one, row by row.
    const at::Tensor flat = t.reshape({-1});
    const int64_t R = t.dim() >= 2 ? t.size(-1) : std::min<int64_t>(t.numel(), kFlatRow);
    for (int64_t start = 0; start < t.numel(); start += R) {
      const float* row = flat.data_ptr<float>() + start;
      const int64_t n = std::min(R, t.numel() - start);
      EXPECT_EQ(row_sum_of_squares(row, n, CpuIsa::kScalar), row_sum_of_squares(row, n, CpuIsa::kAvx2))
          << t.sizes() << " row at " << start;
    }
  }
}

TEST(GradientNorm, OnlyTheNonzeroRowsGiveTheDenseResultBitForBit) {
  at::manual_seed(5);
  for (const int64_t d : {768, 45}) {
    at::Tensor g = at::zeros({1000, d});
    const at::Tensor rows = std::get<0>(at::_unique2(at::randint(1000, {300}, at::kLong), /*sorted=*/true));
    // Rows of magnitudes from 1e-6 to 1e6: any other association of the rows' sums changes the result.
    g.index_copy_(0, rows, at::randn({rows.size(0), d}) * at::pow(10.0, at::rand({rows.size(0), 1}) * 12 - 6));
    EXPECT_EQ(sum_of_squares(g, rows).item<double>(), sum_of_squares(g).item<double>()) << d;

    const float coef = 0.37f;
    at::Tensor dense = g.clone(), sparse = g.clone();
    scale_gradient(dense, coef);
    scale_gradient(sparse, coef, rows);
    EXPECT_TRUE(at::equal(dense, sparse)) << d;
    // ATen's mul_ by the fp32 coefficient, as clip_grad_norm_ scales.
    EXPECT_TRUE(at::equal(dense, g * at::scalar_tensor(coef, at::kFloat))) << d;
  }
  // Rows out of order or out of range are refused with the parameter's name.
  const at::Tensor g = at::ones({4, 3});
  EXPECT_THROW(sum_of_squares(g, at::tensor({2, 1}, at::kLong)), std::exception);
  EXPECT_THROW(sum_of_squares(g, at::tensor({4}, at::kLong)), std::exception);
}

TEST(GradientNorm, ACoefficientOfOneLeavesTheGradientAlone) {
  at::Tensor g = at::tensor({std::nanf(""), 1.0f, -0.0f});  // even values a multiplication would change
  const at::Tensor before = g.clone();
  scale_gradient(g, 1.0f);
  EXPECT_TRUE(at::equal(g.isnan(), before.isnan()));
  EXPECT_TRUE(std::signbit(g[2].item<float>()));
}

TEST(Clipping, MatchesTorchClipGradNormWithAnFp64Norm) {
  for (double max_norm : {0.5, 1e3}) {  // clipped, and a norm below the limit (left as it is)
    at::manual_seed(1);
    std::vector<at::Tensor> ours, theirs, original;
    for (auto shape : {std::vector<int64_t>{70, 50}, {5}, {3, 2, 4}, {100, 768}}) {
      const at::Tensor grad = at::randn(shape) * (shape.size() == 1 ? 1e2 : 1e-2);
      original.push_back(grad);
      for (auto* list : {&ours, &theirs}) {
        at::Tensor p = at::zeros(shape).requires_grad_(true);
        p.mutable_grad() = grad.clone();
        list->push_back(p);
      }
    }
    const double norm = clip_grad_norm(ours, max_norm);
    // Ours: the exact norm rounded once to fp32 (the fp64 sums' own error is ~1e-12 of it).
    double exact_squares = 0;
    for (const at::Tensor& g : original) exact_squares += g.to(at::kDouble).square().sum().item<double>();
    const double exact = std::sqrt(exact_squares);
    EXPECT_NEAR(norm, exact, (tolerance::kFp32Unit + 1e-12) * exact) << max_norm;
    // torch's: an fp32 norm per parameter (a sum of up to 76,800 squares) and the norm of those.
    const double theirs_norm = torch::nn::utils::clip_grad_norm_(theirs, max_norm);
    EXPECT_NEAR(theirs_norm, exact, (tolerance::gamma(100 * 768) + 3 * tolerance::kFp32Unit) * exact) << max_norm;
    // The gradients scaled by clip_grad_norm_'s fp32 coefficient, formed from our norm.
    const at::Tensor coef = at::clamp_max(max_norm / (at::scalar_tensor(static_cast<float>(norm)) + 1e-6), 1.0);
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(at::equal(ours[i].grad(), original[i] * coef)) << i;
      // torch's coefficient differs from ours by the two norms' difference: relatively, a few fp32 roundings.
      const double worst =
          ((ours[i].grad() - theirs[i].grad()).abs() / original[i].abs().clamp_min(1e-30)).max().item<double>();
      EXPECT_LE(worst, tolerance::gamma(100 * 768) + 6 * tolerance::kFp32Unit) << i;
    }
  }
  // max_norm 0: the norm is measured, the gradients are left alone.
  at::Tensor p = at::zeros({2}).requires_grad_(true);
  p.mutable_grad() = at::tensor({3.0f, 4.0f});
  EXPECT_EQ(clip_grad_norm({p}, 0), 5.0);
  EXPECT_TRUE(at::equal(p.grad(), at::tensor({3.0f, 4.0f})));
}

}  // namespace
}  // namespace archspace
