// kernels/fp8_linear: the fused CPU cast equals the unfused ATen arithmetic bit for bit and rounds every value as
// float8_e4m3fn does (its arithmetic is the CUDA launch's too); fp8_linear's forward and both gradients are within
// bounds derived from e4m3's precision of the fp64 products of the unrounded operands, and within the fp32-sum and
// output-rounding bound of the fp64 products of the e4m3 operands; scaling by a power of two commutes with the whole
// computation (huge and tiny amax); a zero tensor gives zeros; and in a model (SequenceOptions::fp8) the block's
// matmuls change, activation checkpointing recomputes them identically, and the modes without training refuse the
// option.
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "archspace/kernels/fp8_linear.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/loss.h"
#include "archspace/train/autocast.h"
#include "forward_option_fields.h"
#include "test_support.h"

namespace archspace {
namespace {

constexpr double kE4m3Unit = 0x1p-4;            // e4m3: 4 significant bits, unit roundoff 2^-4
constexpr double kE4m3SubnormalHalf = 0x1p-10;  // half of e4m3's subnormal spacing 2^-9, in scaled units
constexpr double kFp32Unit = 0x1p-24;
constexpr double kBf16Unit = 0x1p-8;

// The cast as ATen's separate ops compute it (the documented arithmetic, independent of the fused kernel).
E4m3Cast reference_cast(const at::Tensor& t) {
  const at::Tensor f = t.to(at::kFloat);
  const at::Tensor amax = f.abs().max();
  const at::Tensor scale = at::div(at::scalar_tensor(kE4m3Max, amax.options()), amax.clamp_min(kFp8AmaxFloor));
  return {(f * scale).clamp(-kE4m3Max, kE4m3Max).to(at::kFloat8_e4m3fn), scale.reciprocal()};
}

at::Tensor dequantized(const E4m3Cast& c) { return c.values.to(at::kDouble) * c.inverse_scale.to(at::kDouble); }

// A bound on |computed - a b^T| elementwise, a [M, K] and b [N, K] in fp64, when the computation rounds each operand
// to e4m3 with its tensorwise scale s (an entry off by at most ua |a| + eta_a, ua = 2^-4 plus the fp32 rounding of
// a s, eta_a = 2^-10 / s for entries in e4m3's subnormal range), sums the exact e4m3 products in fp32 (gamma_{K+4}
// of the sum of magnitudes: K additions, the two inverse scales, 1/s itself) and rounds the result once to the
// output's unit u_out. With a' = a + da, b' = b + db: |a'b' - ab| <= |da| |b'| + |a| |db| summed over k.
at::Tensor e4m3_product_bound(const at::Tensor& a, const at::Tensor& b, double inverse_a, double inverse_b,
                              double u_out) {
  const double u = kE4m3Unit + 2 * kFp32Unit;
  const double eta_a = kE4m3SubnormalHalf * inverse_a, eta_b = kE4m3SubnormalHalf * inverse_b;
  const at::Tensor aa = a.abs(), ab = b.abs();
  const at::Tensor da = aa * u + eta_a, db = ab * u + eta_b;
  const at::Tensor a1 = aa * (1 + u) + eta_a, b1 = ab * (1 + u) + eta_b;
  const at::Tensor rounding = at::matmul(da, b1.t()) + at::matmul(aa, db.t());
  const int64_t K = a.size(1);
  const double gamma = (K + 4) * kFp32Unit / (1 - (K + 4) * kFp32Unit);
  const at::Tensor sums = at::matmul(a1, b1.t()) * gamma;
  const at::Tensor exact = at::matmul(a, b.t());
  return rounding + sums + (exact.abs() + rounding + sums) * u_out + 1e-300;
}

// The fp32 sums and the output rounding alone: against the fp64 product of the e4m3 operands themselves.
at::Tensor sums_bound(const at::Tensor& a8, const at::Tensor& b8, double u_out) {
  const int64_t K = a8.size(1);
  const double gamma = (K + 4) * kFp32Unit / (1 - (K + 4) * kFp32Unit);
  const at::Tensor sums = at::matmul(a8.abs(), b8.abs().t()) * gamma;
  return sums + (at::matmul(a8, b8.t()).abs() + sums) * u_out + 1e-300;
}

double worst_ratio(const at::Tensor& got, const at::Tensor& expected, const at::Tensor& bound) {
  return ((got.to(at::kDouble) - expected).abs() / bound).max().item<double>();
}

TEST(Fp8Linear, FusedCastIsTheAtenArithmeticBitForBit) {
  at::manual_seed(1);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t n : {1, 17, 1000, 100003}) {  // one task and several (the grain is 32,768 entries)
      at::Tensor t = at::randn({n}) * 3;
      if (n > 1) t[n / 2] = 1e4;  // an outlier: most entries fall into e4m3's subnormal range
      if (dtype == at::kHalf) t = t.clamp(-6e4, 6e4);
      t = t.to(dtype);
      const E4m3Cast got = cast_to_e4m3(t), want = reference_cast(t);
      ASSERT_EQ(got.values.scalar_type(), at::kFloat8_e4m3fn);
      EXPECT_TRUE(at::equal(got.values.view(at::kByte), want.values.view(at::kByte))) << dtype << " n=" << n;
      EXPECT_EQ(got.inverse_scale.item<float>(), want.inverse_scale.item<float>()) << dtype << " n=" << n;
      // amax lands on 448 (the clamp keeps a product rounded just above it finite): no NaN, all of the range used.
      EXPECT_EQ(got.values.to(at::kFloat).abs().max().item<float>(), kE4m3Max);
      EXPECT_FALSE(got.values.to(at::kFloat).isnan().any().item<bool>());
      // Each entry back within u |t| + 2^-10 / scale (+ the fp32 roundings of t s and 1/s) of t.
      const at::Tensor td = t.to(at::kDouble);
      const double inverse = got.inverse_scale.item<double>();
      const at::Tensor bound = td.abs() * (kE4m3Unit + 3 * kFp32Unit) + kE4m3SubnormalHalf * inverse * (1 + kE4m3Unit);
      EXPECT_TRUE(((dequantized(got) - td).abs() <= bound).all().item<bool>()) << dtype << " n=" << n;
    }
  }
  // Not contiguous: cast as the values it holds.
  const at::Tensor m = at::randn({8, 6}).t();
  EXPECT_TRUE(at::equal(cast_to_e4m3(m).values.view(at::kByte), reference_cast(m.contiguous()).values.view(at::kByte)));
}

// The cast's own rounding (src/kernels/fp8_cast_math.h, the CUDA launch's too) against c10's float8_e4m3fn
// conversion, which ATen's to() runs: with amax 448 the scale is exactly 1, so each entry is cast as it is. The
// entries: every bf16 value within +-448 (each exponent and leading mantissa), each midpoint between neighbouring
// e4m3 values and the floats either side of it (the ties and the nearest non-ties), the subnormal range's
// multiples of 2^-12, fp32's own subnormals, and a million random floats, uniform and log-uniform in magnitude.
TEST(Fp8Linear, TheCastRoundsEveryValueAsFloat8E4m3fnDoes) {
  std::vector<float> v = {kE4m3Max, -kE4m3Max, 0.0f, -0.0f, 1e-40f, -1e-45f, 0x1p-126f, 447.99f};
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = c10::BFloat16(static_cast<uint16_t>(bits), c10::BFloat16::from_bits());
    if (std::isfinite(f) && std::fabs(f) <= kE4m3Max) v.push_back(f);
  }
  for (uint32_t bits = 0; bits < 0x7e; ++bits) {  // each finite non-negative e4m3 value but the largest
    const float lo = c10::Float8_e4m3fn(static_cast<uint8_t>(bits), c10::Float8_e4m3fn::from_bits());
    const float hi = c10::Float8_e4m3fn(static_cast<uint8_t>(bits + 1), c10::Float8_e4m3fn::from_bits());
    const float mid = (lo + hi) / 2;  // exact: e4m3's neighbours differ in fewer bits than fp32 holds
    for (float m : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kE4m3Max)}) {
      v.push_back(m);
      v.push_back(-m);
    }
  }
  for (int k = 0; k <= 64; ++k) v.push_back(std::ldexp(static_cast<float>(k), -12));
  at::manual_seed(3);
  const at::Tensor uniform = (at::rand({500000}) * 2 - 1) * kE4m3Max;
  const at::Tensor log_uniform =
      at::exp2(at::rand({500000}) * 40 - 31).clamp_max(kE4m3Max) * at::where(at::rand({500000}) < 0.5, -1.0, 1.0);
  const at::Tensor t = at::cat({at::tensor(v), uniform, log_uniform.to(at::kFloat)});
  const E4m3Cast got = cast_to_e4m3(t);
  ASSERT_EQ(got.inverse_scale.item<float>(), 1.0f);
  const at::Tensor want = t.to(at::kFloat8_e4m3fn).view(at::kByte), have = got.values.view(at::kByte);
  const at::Tensor differ = (want != have).nonzero();
  EXPECT_EQ(differ.size(0), 0) << "first difference at "
                               << (differ.size(0) ? t[differ[0][0].item<int64_t>()].item<float>() : 0.0f);
  // And the same bits from the public composite (ATen's separate ops), the reference the CUDA launch is checked
  // against on a GPU (tests/device/check_kernels.cpp).
  EXPECT_TRUE(at::equal(cast_to_e4m3_composite(t).values.view(at::kByte), have));
  EXPECT_TRUE(
      at::equal(cast_to_e4m3_composite(t * 3).values.view(at::kByte), reference_cast(t * 3).values.view(at::kByte)));
}

TEST(Fp8Linear, ForwardAndGradientsWithinTheE4m3BoundOfFp64) {
  struct Shape {
    int64_t M, K, N;
  };
  // Single rows, odd sizes (the CPU has no multiple-of-16 rule), the tiny preset's projections.
  const std::vector<Shape> shapes = {{1, 16, 16}, {7, 33, 5}, {64, 64, 160}, {24, 160, 64}, {3, 1, 2}};
  for (const Shape& s : shapes) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      at::manual_seed(s.M * 1000 + s.K + s.N);
      const at::Tensor x = (at::randn({2, s.M, s.K}) * 2).to(dtype).requires_grad_(true);
      const at::Tensor w = (at::randn({s.N, s.K}) * 0.1).to(dtype).requires_grad_(true);
      const at::Tensor y = fp8_linear(x, w);
      ASSERT_EQ(y.scalar_type(), at::kBFloat16);
      ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, s.M, s.N}));
      const at::Tensor g = at::randn({2, s.M, s.N}).to(at::kBFloat16);
      y.backward(g);
      ASSERT_EQ(x.grad().scalar_type(), dtype);
      ASSERT_EQ(w.grad().scalar_type(), dtype);
      const std::string what = std::to_string(s.M) + "x" + std::to_string(s.K) + "x" + std::to_string(s.N) + " " +
                               std::string(c10::toString(dtype));

      const at::Tensor xd = x.detach().reshape({-1, s.K}).to(at::kDouble), wd = w.detach().to(at::kDouble);
      const at::Tensor gd = g.reshape({-1, s.N}).to(at::kDouble);
      const E4m3Cast xq = reference_cast(xd.to(at::kFloat)), wq = reference_cast(wd.to(at::kFloat)),
                     gq = reference_cast(gd.to(at::kFloat));
      const double ix = xq.inverse_scale.item<double>(), iw = wq.inverse_scale.item<double>(),
                   ig = gq.inverse_scale.item<double>();
      // dW comes back in fp32 for an fp32 weight, bf16 otherwise; y and dx are rounded to bf16.
      const double u_dw = dtype == at::kFloat ? kFp32Unit : kBf16Unit;
      struct Check {
        const char* name;
        at::Tensor got, a, b;  // got ~ a b^T
        double ia, ib, u_out;
        at::Tensor a8, b8;
      };
      const std::vector<Check> checks = {
          {"y", y.detach().reshape({-1, s.N}), xd, wd, ix, iw, kBf16Unit, dequantized(xq), dequantized(wq)},
          {"dx", x.grad().reshape({-1, s.K}), gd, wd.t(), ig, iw, kBf16Unit, dequantized(gq), dequantized(wq).t()},
          {"dW", w.grad(), gd.t(), xd.t(), ig, ix, u_dw, dequantized(gq).t(), dequantized(xq).t()},
      };
      for (const Check& c : checks) {
        const double e4m3 =
            worst_ratio(c.got, at::matmul(c.a, c.b.t()), e4m3_product_bound(c.a, c.b, c.ia, c.ib, c.u_out));
        const double sums = worst_ratio(c.got, at::matmul(c.a8, c.b8.t()), sums_bound(c.a8, c.b8, c.u_out));
        std::printf("%s %s: max error / e4m3 bound %.3g, against the e4m3 operands / sums bound %.3g\n", what.c_str(),
                    c.name, e4m3, sums);
        EXPECT_LE(e4m3, 1.0) << what << " " << c.name;
        EXPECT_LE(sums, 1.0) << what << " " << c.name;
      }
    }
  }
}

// A power of two moves amax, the scale and the inverse scale exactly, and the e4m3 values not at all: the result is
// the unscaled one times that power bit for bit, for huge and tiny tensors alike (amax 1e31 and 1e-9 here), in the
// forward and in both gradients.
TEST(Fp8Linear, PowerOfTwoScalingCommutesExactly) {
  at::manual_seed(7);
  const at::Tensor x = at::randn({5, 32}), w = at::randn({48, 32}) * 0.05, g = at::randn({5, 48}).to(at::kBFloat16);
  auto run = [&](double sx, double sw) {
    const at::Tensor xs = (x * sx).requires_grad_(true), ws = (w * sw).requires_grad_(true);
    const at::Tensor y = fp8_linear(xs, ws);
    y.backward(g);
    return std::vector<at::Tensor>{y.detach(), xs.grad(), ws.grad()};
  };
  const std::vector<at::Tensor> base = run(1, 1);
  for (double p : {0x1p100, 0x1p-30}) {
    const std::vector<at::Tensor> scaled = run(p, 1);
    EXPECT_TRUE(at::equal(scaled[0], base[0] * p)) << p;  // y scales with x
    EXPECT_TRUE(at::equal(scaled[1], base[1])) << p;      // dx = g W does not depend on x
    EXPECT_TRUE(at::equal(scaled[2], base[2] * p)) << p;  // dW = g^T x scales with x
  }
  const std::vector<at::Tensor> w_scaled = run(1, 0x1p-20);
  EXPECT_TRUE(at::equal(w_scaled[0], base[0] * 0x1p-20));
  EXPECT_TRUE(at::equal(w_scaled[1], base[1] * 0x1p-20));
  EXPECT_TRUE(at::equal(w_scaled[2], base[2]));
}

TEST(Fp8Linear, ZeroTensorsGiveZerosAndNonFiniteInputsStayNonFinite) {
  const at::Tensor x = at::zeros({4, 16}).requires_grad_(true), w = at::randn({16, 16}).requires_grad_(true);
  const E4m3Cast zero = cast_to_e4m3(x.detach());
  EXPECT_TRUE(std::isfinite(zero.inverse_scale.item<float>()));
  EXPECT_EQ(zero.values.to(at::kFloat).abs().max().item<float>(), 0.0f);
  const at::Tensor y = fp8_linear(x, w);
  y.backward(at::ones({4, 16}, at::kBFloat16));
  EXPECT_EQ(y.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(w.grad().abs().max().item<float>(), 0.0f);  // dW = g^T 0
  EXPECT_GT(x.grad().abs().max().item<float>(), 0.0f);  // dx = g W is not
  EXPECT_TRUE(x.grad().isfinite().all().item<bool>());
  for (float bad : {INFINITY, NAN}) {
    at::Tensor xb = at::randn({4, 16});
    xb[1][3] = bad;
    EXPECT_TRUE(fp8_linear(xb, w.detach()).isnan().any().item<bool>()) << bad;
  }
}

// In a model: SequenceOptions::fp8 changes the logits (the block's matmuls really run in FP8), activation
// checkpointing recomputes the same casts (the same logits, the same gradients up to fp32 summation order, as
// tests/unit/test_checkpointing.cpp bounds it: 1e-6 relative), and decoding and the analyses refuse it.
// The FP8 linear's casts are its own (e4m3 in, bf16 or the weight's dtype out), so autocast around it, as training
// has it, changes nothing: the same output and gradients bit for bit with autocast on and off, on whichever path this
// CPU takes (oneDNN's _scaled_mm, or the widened fp32 fallback, whose fp32 GEMM autocast would otherwise run in bf16).
TEST(Fp8Linear, AutocastChangesNothing) {
  at::manual_seed(11);
  const at::Tensor x0 = at::randn({3, 40, 48}), w0 = at::randn({80, 48}) * 0.1, g = at::randn({3, 40, 80});
  auto pass = [&](bool autocast) {
    const at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    at::Tensor y;
    {
      AutocastGuard guard(autocast, at::kCPU);
      y = fp8_linear(x, w);
    }
    y.backward(g.to(y.scalar_type()));
    return std::vector<at::Tensor>{y.detach(), x.grad(), w.grad()};
  };
  const std::vector<at::Tensor> plain = pass(false), autocast = pass(true);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(plain[i].scalar_type(), autocast[i].scalar_type()) << i;
    EXPECT_TRUE(at::equal(plain[i], autocast[i]))
        << i << ": max difference "
        << (plain[i].to(at::kDouble) - autocast[i].to(at::kDouble)).abs().max().item<double>();
  }
}

template <typename Options>
concept RunsFp8 = requires(Options o) {
  o.fp8;
};

TEST(Fp8Linear, ModelForwardWithCheckpointingAndModes) {
  CausalLM model = CausalLM::random_init(preset("tiny", Variant::kBase), 3);
  for (const auto& [name, p] : model.parameters()) p.requires_grad_(true);
  at::manual_seed(5);
  const at::Tensor ids = at::randint(512, {2, 16}, at::kLong), labels = at::randint(512, {2, 16}, at::kLong);
  auto pass = [&](bool fp8, bool checkpointing, std::vector<at::Tensor>* grads) {
    SequenceOptions options;
    options.fp8 = fp8;
    options.activation_checkpointing = checkpointing;
    at::Tensor logits;
    {
      AutocastGuard autocast(true, at::kCPU);
      logits = model.forward(ids, options);
    }
    if (grads) {
      next_token_loss(logits, labels, 0).ce_sum.backward();
      for (const auto& [name, p] : model.parameters()) {
        grads->push_back(p.grad().clone());
        p.mutable_grad().reset();
      }
    }
    return logits.detach();
  };
  std::vector<at::Tensor> full, ckpt;
  const at::Tensor bf16 = pass(false, false, nullptr);
  const at::Tensor fp8 = pass(true, false, &full);
  const at::Tensor fp8_ckpt = pass(true, true, &ckpt);
  EXPECT_FALSE(at::equal(bf16, fp8));
  EXPECT_TRUE(at::equal(fp8, fp8_ckpt));
  double worst = 0, scale = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    scale = std::max(scale, full[i].abs().max().item<double>());
    worst = std::max(worst, (full[i] - ckpt[i]).abs().max().item<double>());
  }
  std::printf("fp8 with checkpointing: max gradient difference %.3g relative\n", worst / scale);
  EXPECT_LE(worst, 1e-6 * scale);

  // fp8 is training's (whole sequences): the analyses' and decoding's options have no such field to be given.
  static_assert(!testing::TakesFp8<AnalysisOptions> && !testing::TakesFp8<DecodeOptions>);
  SequenceOptions sequences;
  sequences.fp8 = true;
  EXPECT_TRUE(ForwardMode(sequences).fp8());
}

}  // namespace
}  // namespace archspace
