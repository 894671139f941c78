// kernels/fused_norm_rope against the ATen forms they replace in inference: rope bit for bit (the same
// roundings), RMSNorm within the rounding of its D-term sum, against fp64; on every CPU path this machine
// runs, fp32 and bf16, strided inputs, and the conditions that keep training on the ATen forms.
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "archspace/kernels/fused_norm_rope.h"
#include "archspace/model/rms_norm.h"
#include "archspace/model/rope.h"

using namespace archspace;

namespace {
// The ATen forms, reached as autograd would reach them: an input that needs a gradient.
at::Tensor aten_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor xg = x.detach().clone().requires_grad_(true);
  EXPECT_FALSE(uses_fused_rms_norm(xg, w));
  return rms_norm(xg, w, eps).detach();
}
at::Tensor aten_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  at::Tensor xg = x.detach().clone().requires_grad_(true);  // clone: contiguous, same values
  EXPECT_FALSE(uses_fused_rope(xg, cos, sin));
  return apply_rope(xg, cos, sin).detach();
}

std::vector<CpuIsa> runnable_paths() {
  std::vector<CpuIsa> paths;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2})
    if (isa <= detected_cpu_isa()) paths.push_back(isa);
  return paths;
}
}  // namespace

// fp64 truth: w * x / sqrt(mean(x^2) + eps) on the same inputs. The fp32 computation rounds the D-term sum
// of squares (relative error <= D * eps32), then the mean, the add, the square root and the division (one
// rounding each), the two products (two more): |y - y64| <= ((D / 2 + 6) * eps32) |y64|, the sum's error
// halved by the square root. bf16 output adds one rounding: 2^-8 of |y|.
TEST(FusedRmsNorm, MatchesFp64OnEveryPathAndDtype) {
  at::manual_seed(0);
  const double eps32 = std::numeric_limits<float>::epsilon();
  for (CpuIsa isa : runnable_paths()) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t D : {1, 7, 8, 64, 77, 768}) {
        at::Tensor x = (at::randn({3, 2, D}) * 3).to(dtype);
        at::Tensor w = (at::rand({D}) + 0.5).to(dtype);
        at::Tensor got = fused_rms_norm(x, w, 1e-6, isa);
        ASSERT_EQ(got.scalar_type(), dtype);
        ASSERT_EQ(got.sizes(), x.sizes());
        at::Tensor x64 = x.to(at::kDouble), w64 = w.to(at::kDouble);
        at::Tensor y64 = w64 * x64 / at::sqrt(x64.pow(2).mean(-1, true) + 1e-6);
        at::Tensor bound = y64.abs() * ((D / 2.0 + 6) * eps32 + (dtype == at::kBFloat16 ? std::ldexp(1.0, -8) : 0.0));
        at::Tensor err = (got.to(at::kDouble) - y64).abs();
        EXPECT_TRUE((err <= bound + 1e-30).all().item<bool>())
            << cpu_isa_name(isa) << " " << dtype << " D=" << D << ": worst error/bound "
            << (err / (bound + 1e-30)).max().item<double>();
        // and the ATen form obeys the same bound, so the two differ by at most twice it
        EXPECT_TRUE(((got.to(at::kDouble) - aten_rms_norm(x, w, 1e-6).to(at::kDouble)).abs() <= 2 * bound + 1e-30)
                        .all()
                        .item<bool>());
      }
    }
  }
}

// The AVX2 and scalar sums run in the same lane order: the paths agree bit for bit.
TEST(FusedRmsNorm, PathsAgreeBitForBit) {
  at::manual_seed(1);
  at::Tensor x = at::randn({5, 300});
  at::Tensor w = at::rand({300});
  if (detected_cpu_isa() < CpuIsa::kAvx2) GTEST_SKIP() << "one path on this CPU";
  EXPECT_TRUE(at::equal(fused_rms_norm(x, w, 1e-6, CpuIsa::kScalar), fused_rms_norm(x, w, 1e-6, CpuIsa::kAvx2)));
  EXPECT_TRUE(at::equal(fused_rms_norm(x.to(at::kBFloat16), w, 1e-6, CpuIsa::kScalar),
                        fused_rms_norm(x.to(at::kBFloat16), w, 1e-6, CpuIsa::kAvx2)));
}

TEST(FusedRmsNorm, RowsAreIndependentAndStridedRowsWork) {
  at::manual_seed(2);
  at::Tensor big = at::randn({6, 2 * 64});
  at::Tensor x = big.narrow(1, 0, 64);  // rows 128 apart
  at::Tensor w = at::rand({64});
  ASSERT_TRUE(uses_fused_rms_norm(x, w));
  at::Tensor batched = rms_norm(x, w, 1e-5);
  for (int64_t r = 0; r < 6; ++r) EXPECT_TRUE(at::equal(batched[r], rms_norm(x[r].contiguous(), w, 1e-5)));
}

TEST(FusedRope, EqualsTheAtenFormBitForBit) {
  at::manual_seed(3);
  const Rope rope{at::pow(10000.0, -at::arange(0, 64, 2, at::kFloat) / 64.0), 1.0};
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t T : {1, 5}) {
      // [B, T, H, h] viewed as [B, H, T, h], as the attention block makes it
      at::Tensor x = (at::randn({2, T, 3, 64}) * 2).to(dtype).transpose(1, 2);
      auto [cos, sin] = rope.tables(at::arange(7, 7 + T, at::kLong));  // [T, h]
      ASSERT_TRUE(uses_fused_rope(x, cos, sin));
      at::Tensor got = apply_rope(x, cos, sin);
      EXPECT_EQ(got.strides(), x.strides());  // the caller's layout, as ATen's elementwise ops keep it
      EXPECT_TRUE(at::equal(got, aten_rope(x, cos, sin))) << dtype << " T=" << T;
      // per-row positions of a left-padded batch: tables [B, 1, T, h]
      auto [bcos, bsin] = rope.tables(at::stack({at::arange(0, T, at::kLong), at::arange(3, 3 + T, at::kLong)}));
      bcos = bcos.unsqueeze(1);
      bsin = bsin.unsqueeze(1);
      ASSERT_TRUE(uses_fused_rope(x, bcos, bsin));
      EXPECT_TRUE(at::equal(apply_rope(x, bcos, bsin), aten_rope(x, bcos, bsin))) << dtype << " batched T=" << T;
    }
  }
}

TEST(FusedNormRope, TrainingKeepsTheAtenForms) {
  at::Tensor w = at::rand({16}).requires_grad_(true);
  at::Tensor x = at::randn({2, 16});
  EXPECT_FALSE(uses_fused_rms_norm(x, w));  // a weight that needs its gradient
  {
    at::AutoGradMode no_grad(false);
    EXPECT_TRUE(uses_fused_rms_norm(x, w));  // evaluation of a trainable model
  }
  EXPECT_FALSE(uses_fused_rms_norm(x.to(at::kDouble), w.detach().to(at::kDouble)));  // fp64 gradient checks
  at::Tensor y = rms_norm(x, w, 1e-6);
  y.sum().backward();
  EXPECT_TRUE(w.grad().defined());
}

// The residual add around a normalised sublayer: the fused form is the two calls' result bit for bit (the norm
// rounded to x's dtype, then one rounding of the sum), on every path, fp32 and bf16, with fp32 or bf16 weights.
TEST(FusedAddRmsNorm, EqualsTheNormThenTheAddBitForBit) {
  at::manual_seed(4);
  for (CpuIsa isa : runnable_paths()) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (at::ScalarType wdtype : {at::kFloat, at::kBFloat16}) {
        for (int64_t D : {64, 77}) {  // 77: the AVX2 sum's scalar tail
          at::Tensor x = (at::randn({2, 3, D}) * 3).to(dtype), r = (at::randn({2, 3, D}) * 5).to(dtype);
          at::Tensor w = (at::rand({D}) + 0.5).to(wdtype);
          ASSERT_TRUE(uses_fused_add_rms_norm(r, x, w));
          const at::Tensor expected = r + fused_rms_norm(x, w, 1e-6, isa);
          const at::Tensor got = fused_add_rms_norm(r, x, w, 1e-6, isa);
          EXPECT_EQ(got.scalar_type(), dtype);
          EXPECT_TRUE(at::equal(got, expected))
              << cpu_isa_name(isa) << " " << dtype << " weights " << wdtype << " D=" << D;
        }
      }
    }
  }
}

TEST(FusedAddRmsNorm, OtherArgumentsTakeTheTwoOps) {
  at::Tensor x = at::randn({2, 8}), r = at::randn({2, 8}), w = at::rand({8});
  EXPECT_FALSE(uses_fused_add_rms_norm(r.to(at::kBFloat16), x, w));             // another dtype
  EXPECT_FALSE(uses_fused_add_rms_norm(at::randn({1, 8}), x, w));               // a broadcast residual
  EXPECT_FALSE(uses_fused_add_rms_norm(at::randn({8, 2}).t(), x, w));           // not contiguous
  EXPECT_FALSE(uses_fused_add_rms_norm(r.clone().requires_grad_(true), x, w));  // autograd must see the add
  const at::Tensor rg = r.clone().requires_grad_(true);
  const at::Tensor y = add_rms_norm(rg, x, w, 1e-6);
  EXPECT_TRUE(y.requires_grad());
  EXPECT_TRUE(at::allclose(y.detach(), r + aten_rms_norm(x, w, 1e-6), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(add_rms_norm(r, x, w, 1e-6), r + aten_rms_norm(x, w, 1e-6), 1e-5, 1e-6));
}

// The Q/K path: the norm over the whole projection, then each head's rotation, in one pass: the two fused calls'
// result bit for bit, for one and several positions, plain [T, h] and per-row [B, 1, T, h] tables, on every path.
TEST(FusedRmsNormRope, EqualsTheNormThenTheRopeBitForBit) {
  at::manual_seed(5);
  const int64_t h = 16;
  const Rope rope{at::pow(10000.0, -at::arange(0, h, 2, at::kFloat) / static_cast<double>(h)), 1.0};
  for (CpuIsa isa : runnable_paths()) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t T : {1, 5}) {
        const int64_t B = 2, H = 3;
        at::Tensor x = (at::randn({B, T, H * h}) * 2).to(dtype);
        at::Tensor w = (at::rand({H * h}) + 0.5).to(dtype);
        auto [cos, sin] = rope.tables(at::arange(9, 9 + T, at::kLong));
        auto [bcos, bsin] = rope.tables(at::stack({at::arange(0, T, at::kLong), at::arange(4, 4 + T, at::kLong)}));
        bcos = bcos.unsqueeze(1);
        bsin = bsin.unsqueeze(1);
        for (const auto& [c, s] : {std::pair{cos, sin}, std::pair{bcos, bsin}}) {
          ASSERT_TRUE(uses_fused_rms_norm_rope(x, w, c, s, h));
          const at::Tensor heads = fused_rms_norm(x, w, 1e-6, isa).view({B, T, H, h}).transpose(1, 2);
          const at::Tensor expected = fused_rope(heads, c, s);
          const at::Tensor got = fused_rms_norm_rope(x, w, 1e-6, c, s, h, isa);
          EXPECT_EQ(got.sizes(), expected.sizes());
          EXPECT_EQ(got.strides(), expected.strides());  // [B, T, H, h] in memory, as the two calls leave it
          EXPECT_TRUE(at::equal(got, expected))
              << cpu_isa_name(isa) << " " << dtype << " T=" << T << " tables " << c.dim() << "-d";
          EXPECT_TRUE(at::equal(rms_norm_rope(x, w, 1e-6, c, s, h), fused_rms_norm_rope(x, w, 1e-6, c, s, h)));
        }
      }
    }
  }
}

TEST(FusedRmsNormRope, OtherArgumentsTakeTheTwoOps) {
  const int64_t h = 8;
  const Rope rope{at::pow(10000.0, -at::arange(0, h, 2, at::kFloat) / static_cast<double>(h)), 1.0};
  at::Tensor x = at::randn({1, 2, 4 * h}), w = at::rand({4 * h});
  auto [cos, sin] = rope.tables(at::arange(0, 2, at::kLong));
  EXPECT_FALSE(uses_fused_rms_norm_rope(x, w, cos, sin, 6));  // heads do not divide the width
  EXPECT_FALSE(uses_fused_rms_norm_rope(x, w, cos.narrow(0, 0, 1), sin.narrow(0, 0, 1), h));  // tables of 1 position
  EXPECT_FALSE(uses_fused_rms_norm_rope(x, w, cos.to(at::kDouble), sin.to(at::kDouble), h));  // tables not fp32
  EXPECT_FALSE(uses_fused_rms_norm_rope(x.view({2, 4 * h}), w, cos, sin, h));                 // not [B, T, width]
  EXPECT_FALSE(uses_fused_rms_norm_rope(x.clone().requires_grad_(true), w, cos, sin, h));
  // Through autograd: the ATen forms, the same values within their roundings.
  const at::Tensor xg = x.clone().requires_grad_(true);
  const at::Tensor y = rms_norm_rope(xg, w, 1e-6, cos, sin, h);
  EXPECT_TRUE(y.requires_grad());
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{1, 4, 2, h}));
  EXPECT_TRUE(at::allclose(y.detach(), rms_norm_rope(x, w, 1e-6, cos, sin, h), 1e-5, 1e-6));
}
