// Weight-only int8 (kernels/int8_weights): the quantization rule against its definition written out here, the
// streaming kernel on every path this CPU runs against the fp64 product with the dequantized weight, the
// prefill path, batch invariance, and the model refusing int8 where it does not belong.
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "archspace/kernels/cpu_isa.h"
#include "archspace/kernels/int8_weights.h"
#include "archspace/kernels/linear.h"
#include "archspace/model/causal_lm.h"
#include "archspace/util/error.h"
#include "test_support.h"

using namespace archspace;

namespace {
using archspace::testing::runnable_paths;

// The kernel forms scale * sum_k q x with fp32 sums: each sum is off from the exact one by at most
// K eps sum|q x| (any order), and the final product by half an ulp; the truth is fp64 with the dequantized
// weight q * scale (exact in fp64). A bf16 result (bf16 x) is that fp32 value rounded once more: off from it by at
// most half a bf16 ulp, 2^-8 of its size.
void expect_close_to_fp64(const at::Tensor& got, const at::Tensor& x, const at::Tensor& q, const std::string& what) {
  const at::Tensor s = q.q_per_channel_scales().to(at::kDouble);
  const at::Tensor w = at::from_blob(q.data_ptr(), q.sizes(), at::kChar).to(at::kDouble) * s.unsqueeze(1);
  const at::Tensor xd = x.to(at::kDouble);
  const at::Tensor exact = at::linear(xd, w);
  const double eps = std::numeric_limits<float>::epsilon();
  at::Tensor bound = at::linear(xd.abs(), w.abs()) * (x.size(-1) * eps) + exact.abs() * eps + 1e-30;
  if (got.scalar_type() == at::kBFloat16) bound = bound + (exact.abs() + bound) * std::ldexp(1.0, -8);
  const at::Tensor err = (got.to(at::kDouble) - exact).abs();
  EXPECT_TRUE((err <= bound).all().item<bool>()) << what << ": max error/bound " << (err / bound).max().item<double>();
}
}  // namespace

// The rule, written out: scale = max|row| / 127 in fp32 (1 for an all-zero row), q = w / scale in fp32 rounded
// half to even; every |q| <= 127 and each weight within half a step of q * scale.
TEST(Int8Weights, QuantizesEachRowSymmetricallyByItsLargestValue) {
  at::manual_seed(0);
  at::Tensor w = at::randn({67, 45});
  w[3].zero_();
  w[5].fill_(-0.25f);  // every value the row's extreme: q = -127 throughout
  const at::Tensor q = quantize_int8_rows(w, "w");
  ASSERT_TRUE(is_int8_weight(q));
  const at::Tensor values = at::from_blob(q.data_ptr(), q.sizes(), at::kChar).clone();
  const at::Tensor scales = q.q_per_channel_scales();
  ASSERT_EQ(scales.scalar_type(), at::kDouble);
  for (int64_t n = 0; n < w.size(0); ++n) {
    float absmax = 0;
    for (int64_t k = 0; k < w.size(1); ++k) absmax = std::max(absmax, std::fabs(w[n][k].item<float>()));
    const float scale = absmax > 0 ? absmax / 127.0f : 1.0f;
    ASSERT_EQ(scales[n].item<double>(), static_cast<double>(scale)) << "row " << n;
    for (int64_t k = 0; k < w.size(1); ++k) {
      const float v = w[n][k].item<float>() / scale;
      ASSERT_EQ(values[n][k].item<int8_t>(), static_cast<int8_t>(std::nearbyint(v))) << n << "," << k;
    }
  }
  EXPECT_TRUE((values.abs() <= 127).all().item<bool>());
  EXPECT_TRUE(at::equal(values[3], at::zeros({45}, at::kChar)));
  EXPECT_TRUE(at::equal(values[5], at::full({45}, -127, at::kChar)));
  // dequantize_int8_rows is q * scale in fp32, within half a step of the weight (plus that product's rounding)
  const at::Tensor back = dequantize_int8_rows(q);
  const at::Tensor half_step =
      scales.to(at::kFloat).unsqueeze(1) * (0.5f + 128 * std::numeric_limits<float>::epsilon());
  EXPECT_TRUE(((back - w).abs() <= half_step).all().item<bool>());
  EXPECT_EQ(dequantize_int8_rows(q, at::kBFloat16).scalar_type(), at::kBFloat16);
  // bf16 weights quantize from their values (widened exactly)
  EXPECT_TRUE(at::equal(
      at::from_blob(quantize_int8_rows(w.to(at::kBFloat16), "w").data_ptr(), q.sizes(), at::kChar),
      at::from_blob(quantize_int8_rows(w.to(at::kBFloat16).to(at::kFloat), "w").data_ptr(), q.sizes(), at::kChar)));
}

TEST(Int8Weights, RefusesWhatItCannotQuantizeNamingTheTensor) {
  at::Tensor w = at::randn({4, 8});
  w[2][3] = std::numeric_limits<float>::quiet_NaN();
  try {
    quantize_int8_rows(w, "model.safetensors: tensor 'lm_head.weight'");
    FAIL() << "a NaN weight was quantized";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors: tensor 'lm_head.weight': holds NaN or infinite"),
              std::string::npos)
        << e.what();
  }
  w[2][3] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(quantize_int8_rows(w, "w"), Error);
  EXPECT_THROW(quantize_int8_rows(at::randn({4}), "w"), Error);               // not 2-D
  EXPECT_THROW(quantize_int8_rows(at::ones({4, 8}, at::kLong), "w"), Error);  // not floating point
  EXPECT_THROW(int8_linear(at::randn({1, 8}), at::randn({4, 8})), Error);     // not an int8 weight
  const at::Tensor q = quantize_int8_rows(at::randn({4, 8}), "w");
  EXPECT_THROW(int8_streaming_linear(at::randn({1, 9}), q), Error);               // wrong width
  EXPECT_THROW(int8_streaming_linear(at::randn({1, 8}, at::kDouble), q), Error);  // not fp32/bf16
  EXPECT_FALSE(is_int8_weight(at::randn({4, 8})));
}

// Every tail: K off the 8 (AVX2) and 16 (AVX512) lane counts, N off the 4-row blocks, 1..8 rows of x (each
// count of x rows a pass and their tails), fp32 and bf16 x.
TEST(Int8Weights, KernelMatchesFp64OnEveryPathAndTail) {
  at::manual_seed(1);
  for (CpuIsa isa : runnable_paths()) {
    for (int64_t K : {1, 7, 8, 15, 16, 17, 33, 64, 768}) {
      for (int64_t N : {1, 3, 4, 5, 130}) {
        const at::Tensor q = quantize_int8_rows(at::randn({N, K}), "w");
        for (int64_t M : {1, 2, 3, 5, 7, 8}) {  // x rows a pass: 4, 2 and 1 on AVX512, 2 and 1 on AVX2
          const std::string what = std::string(cpu_isa_name(isa)) + " M=" + std::to_string(M) +
                                   " N=" + std::to_string(N) + " K=" + std::to_string(K);
          const at::Tensor x = at::randn({M, K});
          const at::Tensor got = int8_streaming_linear(x, q, isa);
          ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{M, N})) << what;
          ASSERT_EQ(got.scalar_type(), at::kFloat) << what;
          expect_close_to_fp64(got, x, q, what);
          // bf16 x: the fp32 result rounded to bf16 once (half an ulp, 2^-8 relative). Below AVX512-BF16 x is
          // widened exactly and takes the fp32 kernel's sums; with it, vdpbf16ps sums the same exact products in
          // an order of its own (BF16ActivationsTakeTheBf16WeightKernelsSteps).
          const at::Tensor xb = x.to(at::kBFloat16);
          const at::Tensor gotb = int8_streaming_linear(xb, q, isa);
          ASSERT_EQ(gotb.scalar_type(), at::kBFloat16) << what;
          expect_close_to_fp64(gotb, xb, q, what + " bf16 x");
          if (isa < CpuIsa::kAvx512Bf16)
            EXPECT_TRUE(at::equal(gotb, int8_streaming_linear(xb.to(at::kFloat), q, isa).to(at::kBFloat16))) << what;
        }
      }
    }
  }
}

// With integer x the sums are exact in fp32 (|sum| < 2^24), so every path gives the same bits: a lane or row a
// vector path drops or doubles shows.
TEST(Int8Weights, PathsAgreeExactlyOnExactSums) {
  at::manual_seed(2);
  const at::Tensor q = quantize_int8_rows(at::randint(-127, 128, {37, 100}).to(at::kFloat), "w");  // scale ~1
  std::vector<at::Tensor> kept;  // every result stays allocated: a path that skipped an output would otherwise
                                 // find the previous path's right answer in the reused memory
  for (int64_t M : {7, 1}) {     // passes over 4, 2 and 1 rows of x (AVX512), 2 and 1 (AVX2)
    const at::Tensor x = at::randint(-8, 9, {M, 100}).to(at::kFloat);
    const at::Tensor reference = int8_streaming_linear(x, q, CpuIsa::kScalar);
    for (CpuIsa isa : runnable_paths()) {
      kept.push_back(int8_streaming_linear(x, q, isa));
      EXPECT_TRUE(at::equal(kept.back(), reference)) << cpu_isa_name(isa) << " M=" << M;
    }
  }
}

TEST(Int8Weights, RowsAreBatchInvariantBitForBit) {
  at::manual_seed(3);
  for (CpuIsa isa : runnable_paths()) {
    const at::Tensor q = quantize_int8_rows(at::randn({131, 100}), "w");
    const at::Tensor x = at::randn({9, 100});
    const at::Tensor batched = int8_streaming_linear(x, q, isa);
    for (int64_t m = 0; m < 9; ++m)
      EXPECT_TRUE(at::equal(batched[m], int8_streaming_linear(x.narrow(0, m, 1), q, isa)[0])) << cpu_isa_name(isa);
  }
}

// bf16 x takes the bf16-weight kernel's steps on every path (kernels/streaming_gemv_bf16.h on AVX512-BF16, the
// shared AVX2 and scalar kernels below it), with the int8 values widened exactly: with every scale 1 (each row's
// largest |w| is 127) the int8 result is the bf16 kernel's on the same values bit for bit, for every tail of K
// (32 lanes), of N (the 8- and 4-row blocks) and of the rows of x; and each row is batch invariant.
TEST(Int8Weights, BF16ActivationsTakeTheBf16WeightKernelsSteps) {
  at::manual_seed(6);
  for (CpuIsa isa : runnable_paths()) {
    for (int64_t K : {1, 31, 32, 33, 100, 768}) {
      for (int64_t N : {3, 8, 13, 130}) {
        at::Tensor w = at::randint(-127, 128, {N, K}).to(at::kFloat);
        w.select(1, 0).fill_(127);  // the largest |w| of every row: scale 127 / 127 = 1
        const at::Tensor q = quantize_int8_rows(w, "w");
        ASSERT_TRUE(at::equal(q.q_per_channel_scales(), at::ones({N}, at::kDouble)));
        const at::Tensor as_bf16 = q.int_repr().to(at::kBFloat16);  // exact: |q| <= 127
        const at::Tensor x = at::randn({9, K}).to(at::kBFloat16);
        const at::Tensor batched = int8_streaming_linear(x, q, isa);
        for (int64_t M : {1, 2, 3, 4, 5, 8, 9}) {
          const std::string what = std::string(cpu_isa_name(isa)) + " M=" + std::to_string(M) +
                                   " N=" + std::to_string(N) + " K=" + std::to_string(K);
          const at::Tensor xm = x.narrow(0, 0, M);
          EXPECT_TRUE(at::equal(int8_streaming_linear(xm, q, isa), streaming_linear(xm, as_bf16, isa))) << what;
          EXPECT_TRUE(at::equal(int8_streaming_linear(x.narrow(0, M - 1, 1), q, isa)[0], batched[M - 1])) << what;
        }
      }
    }
  }
}

// linear() sends an int8 weight to int8_linear: few rows to the kernel, many rows (prefill) and autograd through
// x's GEMM on the widened rows, then the scales.
TEST(Int8Weights, LinearTakesTheKernelForFewRowsAndDequantizedBlocksForMany) {
  at::manual_seed(4);
  const at::Tensor q = quantize_int8_rows(at::randn({4096 + 37, 24}), "w");
  const at::Tensor w = dequantize_int8_rows(q);
  const at::Tensor few = at::randn({2, 1, 24});
  const at::Tensor got_few = archspace::linear(few, q);
  ASSERT_EQ(got_few.sizes().vec(), (std::vector<int64_t>{2, 1, 4096 + 37}));
  EXPECT_TRUE(at::equal(got_few, int8_streaming_linear(few, q)));
  const at::Tensor many = at::randn({kStreamingLinearMaxRows + 1, 24});
  const at::Tensor got_many = archspace::linear(many, q);
  ASSERT_EQ(got_many.sizes().vec(), (std::vector<int64_t>{kStreamingLinearMaxRows + 1, 4096 + 37}));
  expect_close_to_fp64(got_many, many, q, "prefill");
  // autograd reaches x through the dequantized blocks
  const at::Tensor x = at::randn({1, 24}).requires_grad_(true);
  archspace::linear(x, q).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  // d(sum y)/dx = the column sums of w: two fp32 orders of N terms, each within N eps sum|w| of the exact sum
  const at::Tensor column_bound = w.abs().sum(0, true) * (2.0 * w.size(0) * std::numeric_limits<float>::epsilon());
  EXPECT_TRUE(((x.grad() - w.sum(0, true)).abs() <= column_bound).all().item<bool>());
  // bf16 activations: bf16 in, bf16 out on both routes
  EXPECT_EQ(archspace::linear(few.to(at::kBFloat16), q).scalar_type(), at::kBFloat16);
  EXPECT_EQ(archspace::linear(many.to(at::kBFloat16), q).scalar_type(), at::kBFloat16);
}

// bf16 x takes the kernel up to 16 rows where AVX512-BF16 runs it (beyond, the bf16 GEMM is faster), fp32 x up to 64.
TEST(Int8Weights, RowsTheKernelTakesDependOnXsDtypeAndTheCpu) {
  const at::Tensor q = quantize_int8_rows(at::randn({8, 24}), "w");
  const int64_t bf16_rows =
      kernel_isa() >= CpuIsa::kAvx512Bf16 ? kInt8StreamingLinearMaxRowsBf16 : kStreamingLinearMaxRows;
  EXPECT_EQ(int8_streaming_linear_max_rows(at::kBFloat16), bf16_rows);
  EXPECT_EQ(int8_streaming_linear_max_rows(at::kFloat), kStreamingLinearMaxRows);
  for (const auto& [dtype, rows] :
       {std::pair{at::kBFloat16, bf16_rows}, std::pair{at::kFloat, kStreamingLinearMaxRows}}) {
    EXPECT_TRUE(uses_int8_streaming_linear(at::randn({rows, 24}).to(dtype), q)) << c10::toString(dtype);
    EXPECT_FALSE(uses_int8_streaming_linear(at::randn({rows + 1, 24}).to(dtype), q)) << c10::toString(dtype);
  }
}

// Prefill's route: the int8 values widened exactly, x's own GEMM, then each output column times its scale in fp32,
// rounded once to x's dtype: bit for bit at::linear on the widened values followed by that product, for fp32 and
// bf16 activations (the bf16 rounding is the engine's own loop, held here to ATen's round-to-nearest-even).
// A weight wider than one widened block (32 MB) is split and joined: within the fp64 bound like any other.
TEST(Int8Weights, PrefillScalesTheGemmOutputOnceAfterTheSums) {
  at::manual_seed(5);
  const at::Tensor q = quantize_int8_rows(at::randn({300, 64}), "w");
  const at::Tensor values = q.int_repr(), scales = q.q_per_channel_scales().to(at::kFloat);
  const at::Tensor x = at::randn({kStreamingLinearMaxRows + 3, 64});
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor xd = x.to(dtype);
    const at::Tensor expected = (at::linear(xd, values.to(dtype)).to(at::kFloat) * scales).to(dtype);
    EXPECT_TRUE(at::equal(archspace::linear(xd, q), expected)) << c10::toString(dtype);
  }
  const at::Tensor wide = quantize_int8_rows(at::randn({4100, 2048}), "wide");  // 33.6 MB widened to fp32
  const at::Tensor rows = at::randn({kStreamingLinearMaxRows + 1, 2048});
  expect_close_to_fp64(archspace::linear(rows, wide), rows, wide, "two widened blocks");
}

// A model takes int8 for its matmul weights only; the forward then runs through the int8 kernel and equals the
// model built from the dequantized weights up to the sums' order.
TEST(Int8Weights, ModelAcceptsInt8MatmulWeightsOnly) {
  const ModelConfig config = preset("tiny");
  const CausalLM fp32 = CausalLM::random_init(config, 0);
  NamedTensors int8, dequantized;
  const auto specs = parameter_specs(config);
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [name, t] = fp32.parameters()[i];
    if (specs[i].kind == ParamKind::kLinear) {
      int8.emplace_back(name, quantize_int8_rows(t, name));
      dequantized.emplace_back(name, dequantize_int8_rows(int8.back().second));
    } else {
      int8.emplace_back(name, t);
      dequantized.emplace_back(name, t);
    }
  }
  const CausalLM quantized(config, int8), reference(config, dequantized);
  EXPECT_EQ(quantized.dtype(), at::kFloat);
  at::NoGradGuard no_grad;
  const at::Tensor ids = at::tensor({3, 7, 11, 2, 40, 9}, at::kLong).unsqueeze(0);
  const at::Tensor a = quantized.forward(ids), b = reference.forward(ids);
  EXPECT_TRUE(at::allclose(a, b, 1e-4, 1e-5)) << (a - b).abs().max().item<double>();
  EXPECT_FALSE(at::equal(a, fp32.forward(ids)));  // the weights really changed
  // The embedding is gathered, not multiplied: int8 there is refused, naming it.
  NamedTensors bad = int8;
  bad[0].second = quantize_int8_rows(bad[0].second, bad[0].first);
  try {
    CausalLM(config, bad);
    FAIL() << "an int8 embedding was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.embed_tokens.weight' is int8"), std::string::npos) << e.what();
  }
}
