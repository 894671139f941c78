// kernels/decode_attention against an fp64 softmax(scale q k^T) v computed here from the definition and against
// at::scaled_dot_product_attention, on every CPU path this machine runs, fp32 and bf16, GQA, padding masks,
// the cache's strided views; its exp against std::exp; and the conditions that keep other calls on SDPA.
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "archspace/kernels/decode_attention.h"
#include "archspace/model/attention.h"
#include "tolerance.h"

using namespace archspace;

namespace {

std::vector<CpuIsa> runnable_paths() {
  std::vector<CpuIsa> paths;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2})
    if (isa <= detected_cpu_isa()) paths.push_back(isa);
  return paths;
}

// The definition in fp64: per (b, h), kv head h / (H / G), masked keys at -inf.
at::Tensor reference64(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                       const at::Tensor& mask) {
  const int64_t groups = q.size(1) / k.size(1);
  at::Tensor k64 = k.to(at::kDouble).repeat_interleave(groups, 1), v64 = v.to(at::kDouble).repeat_interleave(groups, 1);
  at::Tensor scores = at::matmul(q.to(at::kDouble), k64.transpose(-1, -2)) * scale;  // [B, H, 1, Tk]
  if (mask.defined()) scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), v64);
}

// The kernel's error against exact, to first order. The scores: a D-term dot product and the scale,
// gamma(D + 1) S (S the largest scale * sum_d |q_d k_d|); subtracting the maximum rounds once (u 2S); exp
// within 4u relative (tested below). The maximum is common to every weight and cancels, so each weight p_j
// is within eta = gamma(D + 1) S + 2u S + 4u relative of exact; normalising doubles that (numerator and the
// sum), the sum of weights adds gamma(Tk), the weighted sum of values gamma(Tk) of sum p_j |v_j| and the
// division u. All relative to sum_j w_j |v_j| <= max|v|.
double kernel_bound(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  using tolerance::gamma;
  const double u = tolerance::kFp32Unit;
  const int64_t D = q.size(-1), Tk = k.size(2), groups = q.size(1) / k.size(1);
  const at::Tensor kk = k.to(at::kDouble).abs().repeat_interleave(groups, 1);
  const double S = at::matmul(q.to(at::kDouble).abs(), kk.transpose(-1, -2)).max().item<double>() * scale;
  const double eta = gamma(D + 1) * S + 2 * u * S + 4 * u;
  return (2 * eta + 2 * gamma(Tk) + u) * tolerance::magnitude(v);
}

constexpr double kBf16Unit = 0x1p-8;  // bf16's unit roundoff (8 significant bits)

struct Case {
  at::Tensor q, k, v, mask;
};

// q as the model makes it (a transposed [B, 1, H, D]); k a narrowed [B, G, capacity, D] buffer (the cache),
// v a transposed [B, capacity, G, D] one: last dims contiguous, every other stride general.
Case make_case(int64_t B, int64_t H, int64_t G, int64_t Tk, int64_t D, at::ScalarType dtype, bool masked) {
  Case c;
  c.q = (at::randn({B, 1, H, D}) * 1.5).to(dtype).transpose(1, 2);
  c.k = at::randn({B, G, Tk + 9, D}).to(dtype).narrow(2, 4, Tk);
  c.v = at::randn({B, Tk + 3, G, D}).to(dtype).transpose(1, 2).narrow(2, 1, Tk);
  if (masked) {
    c.mask = at::rand({B, 1, 1, Tk}) < 0.7;
    c.mask.select(3, Tk - 1).fill_(true);                     // the query's own key is always real
    if (B > 1) c.mask[0].narrow(-1, 0, Tk - 1).fill_(false);  // a row that sees one key only
  }
  return c;
}

}  // namespace

// Every shape the brief lists, on every path and dtype: within kernel_bound of fp64, and SDPA (with
// enable_gqa, on the same views and mask) within the sum of both computations' bounds: tolerance.h's
// attention_bound is twice one computation's error, so SDPA is within half of it of exact. bf16 adds each
// output's rounding (u_bf16 |out|), and SDPA's CPU kernel on bf16 rounds its probabilities to bf16 before the
// weighted sum (u_bf16 max|v|).
TEST(DecodeAttention, MatchesFp64AndSdpa) {
  at::manual_seed(0);
  int64_t checked = 0;
  for (CpuIsa isa : runnable_paths())
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
      for (int64_t groups : {1, 2, 4})
        for (int64_t D : {16, 64, 128, 13})
          for (int64_t Tk : {1, 7, 32, 1000})
            for (bool masked : {false, true}) {
              const int64_t B = 3, G = 2, H = G * groups;
              Case c = make_case(B, H, G, Tk, D, dtype, masked);
              const double scale = 1.0 / std::sqrt(static_cast<double>(D));
              at::Tensor got = decode_attention(c.q, c.k, c.v, scale, c.mask, isa);
              ASSERT_EQ(got.scalar_type(), dtype);
              ASSERT_EQ(got.sizes(), c.q.sizes());
              at::Tensor exact = reference64(c.q, c.k, c.v, scale, c.mask);
              const bool bf16 = dtype == at::kBFloat16;
              const double vmax = tolerance::magnitude(c.v);
              // bf16: |fl(y) - exact| <= u_bf16 |y| + |y - exact| <= u_bf16 |exact| + (1 + u_bf16) kernel_bound
              const double u16 = bf16 ? kBf16Unit : 0.0;
              at::Tensor bound = kernel_bound(c.q, c.k, c.v, scale) * (1 + u16) + exact.abs() * u16;
              at::Tensor err = (got.to(at::kDouble) - exact).abs();
              tolerance::detail::log_check(err.max().item<double>(), bound.max().item<double>(),
                                           (err / bound).max().item<double>());
              EXPECT_TRUE((err <= bound).all().item<bool>())
                  << cpu_isa_name(isa) << " " << dtype << " groups=" << groups << " D=" << D << " Tk=" << Tk
                  << " masked=" << masked << ": worst error/bound " << (err / bound).max().item<double>();
              at::Tensor sdpa = at::scaled_dot_product_attention(
                  c.q, c.k, c.v, c.mask.defined() ? std::optional<at::Tensor>(c.mask) : std::nullopt, 0.0, false, scale,
                  /*enable_gqa=*/groups > 1);
              at::Tensor sdpa_bound = bound + tolerance::attention_bound(c.q, c.k, c.v, Tk) / 2 +
                                      (bf16 ? kBf16Unit * (exact.abs() + vmax) : at::zeros_like(exact));
              at::Tensor diff = (got.to(at::kDouble) - sdpa.to(at::kDouble)).abs();
              tolerance::detail::log_check(diff.max().item<double>(), sdpa_bound.max().item<double>(),
                                           (diff / sdpa_bound).max().item<double>());
              EXPECT_TRUE((diff <= sdpa_bound).all().item<bool>())
                  << "against SDPA: " << cpu_isa_name(isa) << " " << dtype << " groups=" << groups << " D=" << D
                  << " Tk=" << Tk << " masked=" << masked << ": worst " << (diff / sdpa_bound).max().item<double>();
              ++checked;
            }
  EXPECT_EQ(checked, static_cast<int64_t>(runnable_paths().size()) * 2 * 3 * 4 * 4 * 2);
}

// A row's result depends on its own inputs only: alone, or batched with neighbours that differ (other keys,
// other masks), the same bits. Large enough (B H Tk D) that the batched call may split over threads.
TEST(DecodeAttention, RowAloneEqualsRowBatched) {
  at::manual_seed(1);
  for (CpuIsa isa : runnable_paths())
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      Case c = make_case(8, 8, 2, 1000, 64, dtype, /*masked=*/true);
      at::Tensor batched = decode_attention(c.q, c.k, c.v, 0.125, c.mask, isa);
      for (int64_t b = 0; b < 8; ++b) {
        at::Tensor alone = decode_attention(c.q.narrow(0, b, 1), c.k.narrow(0, b, 1), c.v.narrow(0, b, 1), 0.125,
                                            c.mask.narrow(0, b, 1), isa);
        EXPECT_TRUE(at::equal(alone, batched.narrow(0, b, 1))) << cpu_isa_name(isa) << " " << dtype << " row " << b;
      }
    }
}

// Masked keys contribute exactly 0: NaN in their keys and values changes no bit; a mask broadcast over the
// batch reads as the expanded one; a row with no key allowed is NaN, as softmax over all -inf is.
TEST(DecodeAttention, MaskedKeysContributeNothing) {
  at::manual_seed(2);
  for (CpuIsa isa : runnable_paths()) {
    Case c = make_case(2, 4, 2, 40, 16, at::kFloat, /*masked=*/true);
    at::Tensor clean = decode_attention(c.q, c.k, c.v, 0.25, c.mask, isa);
    at::Tensor hidden = c.mask.logical_not().view({2, 1, 40, 1});  // [B, 1, Tk, 1] against [B, G, Tk, D]
    c.k.masked_fill_(hidden, std::numeric_limits<float>::quiet_NaN());
    c.v.masked_fill_(hidden, std::numeric_limits<float>::quiet_NaN());
    EXPECT_TRUE(at::equal(decode_attention(c.q, c.k, c.v, 0.25, c.mask, isa), clean)) << cpu_isa_name(isa);

    at::Tensor shared = at::rand({40}) < 0.5;
    shared[39] = true;
    EXPECT_TRUE(at::equal(decode_attention(c.q, c.k.nan_to_num(0), c.v.nan_to_num(0), 0.25, shared, isa),
                          decode_attention(c.q, c.k.nan_to_num(0), c.v.nan_to_num(0), 0.25,
                                           shared.view({1, 1, 1, 40}).expand({2, 1, 1, 40}).contiguous(), isa)));

    at::Tensor none = at::zeros({2, 1, 1, 40}, at::kBool);
    none[1].fill_(true);
    at::Tensor out = decode_attention(c.q, c.k.nan_to_num(0), c.v.nan_to_num(0), 0.25, none, isa);
    EXPECT_TRUE(out[0].isnan().all().item<bool>());
    EXPECT_TRUE(out[1].isfinite().all().item<bool>());
  }
}

// The AVX2 exp against exp in fp64 over its range: within 4u = 2^-22 relative (2 ulp at most); 0 below its
// low end (where exp is under FLT_MIN), NaN kept. Without AVX2 it is std::exp, held to the same bound.
TEST(DecodeAttention, ExpWithinTwoUlp) {
  const int64_t n = 1 << 20;
  at::Tensor x = at::cat({at::linspace(-87.33, 88.3, n, at::kFloat), at::rand({n}) * -20,
                          at::tensor({0.0f, -0.0f, 1e-8f, -1e-8f, 0.34657359f, -0.34657359f})});
  for (CpuIsa isa : {CpuIsa::kScalar, max_cpu_isa()}) {
    at::Tensor y = x.clone();
    decode_attention_exp(y.mutable_data_ptr<float>(), y.numel(), isa);
    at::Tensor exact = at::exp(x.to(at::kDouble));
    at::Tensor rel = ((y.to(at::kDouble) - exact) / exact).abs();
    EXPECT_LE(rel.max().item<double>(), 0x1p-22) << cpu_isa_name(isa);
  }
  std::vector<float> edge = {-87.4f,
                             -100.0f,
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN(),
                             0.0f,
                             -1.0f,
                             -2.0f,
                             -3.0f,
                             -4.0f};
  decode_attention_exp(edge.data(), static_cast<int64_t>(edge.size()), max_cpu_isa());
  // Below exp's normal range: 0 on the AVX2 path, std::exp's subnormal value on the scalar one
  // (ARCHSPACE_MAX_CPU_ISA=scalar, as scripts/kernel_paths.sh baseline runs it); never more.
  EXPECT_LE(edge[0], std::numeric_limits<float>::min());
  EXPECT_LE(edge[1], std::numeric_limits<float>::min());
  EXPECT_GE(edge[1], 0.0f);
  EXPECT_EQ(edge[2], 0.0f);
  EXPECT_TRUE(std::isnan(edge[3]));
  EXPECT_EQ(edge[4], 1.0f);
}

// causal_attention takes the kernel for a decode step (no mask, or a padded batch's padding mask) in
// inference; with a gradient wanted, or shapes and types it does not take, the call stays on SDPA.
TEST(DecodeAttention, DispatchAndConditions) {
  at::manual_seed(3);
  Case c = make_case(3, 4, 2, 20, 16, at::kFloat, /*masked=*/true);
  const double scale = 0.25;
  EXPECT_TRUE(
      at::equal(causal_attention(c.q, c.k, c.v, 0, 19, AttentionImpl::kSdpa), decode_attention(c.q, c.k, c.v, scale)));
  EXPECT_TRUE(at::equal(causal_attention(c.q, c.k, c.v, 0, 19, AttentionImpl::kSdpa, c.mask),
                        decode_attention(c.q, c.k, c.v, scale, c.mask)));
  EXPECT_TRUE(uses_decode_attention(c.q, c.k, c.v, c.mask));
  EXPECT_TRUE(uses_decode_attention(c.q, c.k, c.v, at::ones({20}, at::kBool)));

  at::Tensor qg = c.q.detach().clone().requires_grad_(true);
  EXPECT_FALSE(uses_decode_attention(qg, c.k, c.v));
  {
    at::NoGradGuard no_grad;
    EXPECT_TRUE(uses_decode_attention(qg, c.k, c.v));
  }
  EXPECT_FALSE(uses_decode_attention(c.q.to(at::kHalf), c.k.to(at::kHalf), c.v.to(at::kHalf)));
  EXPECT_FALSE(uses_decode_attention(c.q.to(at::kBFloat16), c.k, c.v));                      // mixed dtypes
  EXPECT_FALSE(uses_decode_attention(c.q.expand({3, 4, 2, 16}), c.k, c.v));                  // two queries
  EXPECT_FALSE(uses_decode_attention(c.q.narrow(1, 0, 3), c.k, c.v));                        // H not a multiple of G
  EXPECT_FALSE(uses_decode_attention(c.q, c.k, c.v.narrow(2, 0, 19)));                       // k and v disagree
  EXPECT_FALSE(uses_decode_attention(c.q, at::randn({3, 2, 16, 20}).transpose(2, 3), c.v));  // last dim strided
  EXPECT_FALSE(uses_decode_attention(c.q, c.k, c.v, c.mask.to(at::kFloat)));                 // an additive mask
  EXPECT_FALSE(uses_decode_attention(c.q, c.k, c.v, at::ones({3, 1, 2, 20}, at::kBool)));    // two query rows
  EXPECT_FALSE(uses_decode_attention(c.q, c.k, c.v, at::ones({3, 1, 1, 21}, at::kBool)));    // other keys
  EXPECT_THROW(decode_attention(c.q, c.k, c.v.narrow(2, 0, 19), scale), c10::Error);
}
