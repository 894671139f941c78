// Greedy decoding's vectorised argmax against at::argmax: every tail length, ties (the first wins, -0 == +0),
// NaN (the first NaN wins, as at::argmax takes NaN as the largest), infinities, and strided or non-float rows
// that go to at::argmax. The kernel-paths pass runs this on the AVX2 and the scalar path.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "archspace/kernels/argmax.h"
#include "archspace/kernels/cpu_isa.h"

using namespace archspace;

namespace {
void expect_same_as_aten(const at::Tensor& row, const std::string& what) {
  const at::Tensor c = row.contiguous();
  EXPECT_EQ(argmax_first(c.const_data_ptr<float>(), c.numel()), c.argmax().item<int64_t>())
      << what << " (n=" << c.numel() << ", isa " << cpu_isa_name(max_cpu_isa()) << ")";
}
}  // namespace

TEST(Argmax, EqualsAtenOnRandomRowsOfEveryTail) {
  at::manual_seed(0);
  for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 31, 100, 1027, 100278}) {
    for (int trial = 0; trial < 4; ++trial) expect_same_as_aten(at::randn({n}), "random");
  }
}

TEST(Argmax, FirstOfEqualMaximaWins) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 5, 8, 13, 64, 1001}) {
    expect_same_as_aten(at::zeros({n}), "all zero");
    expect_same_as_aten(at::full({n}, -inf), "all -inf");
    at::Tensor signed_zeros = at::full({n}, -1.0f);  // -0 first, +0 last: equal, so -0's index wins
    signed_zeros[n / 2] = -0.0f;
    if (n > 1) signed_zeros[n - 1] = 0.0f;
    expect_same_as_aten(signed_zeros, "-0 before +0");
    for (int64_t first : {int64_t{0}, n / 3, n - 1}) {
      at::Tensor x = at::randn({n}) - 10;
      x[first] = 5.0f;
      for (int64_t later = first + 1; later < n; later += 3) x[later] = 5.0f;
      expect_same_as_aten(x, "ties at " + std::to_string(first));
      x[first] = inf;
      expect_same_as_aten(x, "+inf at " + std::to_string(first));
    }
  }
}

TEST(Argmax, FirstNanWins) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n : {1, 3, 8, 9, 24, 100278}) {
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      at::Tensor x = at::randn({n});
      x[0] = std::numeric_limits<float>::infinity();
      x[at] = nan;
      if (at + 2 < n) x[at + 2] = nan;
      expect_same_as_aten(x, "NaN at " + std::to_string(at));
    }
  }
}

TEST(Argmax, OtherRowsGoToAten) {
  at::manual_seed(1);
  at::Tensor m = at::randn({7, 300});
  at::Tensor column = m.select(1, 5);  // strided
  EXPECT_EQ(argmax_index(column), column.argmax().item<int64_t>());
  at::Tensor half = at::randn({301}).to(at::kBFloat16);
  EXPECT_EQ(argmax_index(half), half.argmax().item<int64_t>());
  EXPECT_EQ(argmax_index(m[3]), m[3].argmax().item<int64_t>());
  EXPECT_THROW(argmax_first(nullptr, 0), std::exception);
}

// Sampling's fp32 logits: a bf16 model's widened exactly (every bf16 value is an fp32 value), infinities and NaN
// kept; other dtypes and strided rows through Tensor::to, with the same values.
TEST(LogitsToFloat, EqualsTensorTo) {
  at::manual_seed(6);
  at::Tensor x = (at::randn({3, 1001}) * 30).to(at::kBFloat16);
  x[0][5] = std::numeric_limits<float>::infinity();
  x[1][7] = -std::numeric_limits<float>::infinity();
  x[2][9] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor got = logits_to_float(x);
  EXPECT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(got.nan_to_num(0, 1, -1), x.to(at::kFloat).nan_to_num(0, 1, -1)));
  EXPECT_TRUE(std::isnan(got[2][9].item<float>()));
  for (const at::Tensor& other : {x.t(), x.to(at::kFloat), x.to(at::kHalf)}) {
    const at::Tensor y = logits_to_float(other);
    EXPECT_EQ(y.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(y.nan_to_num(0, 1, -1), other.to(at::kFloat).nan_to_num(0, 1, -1)));
  }
}
