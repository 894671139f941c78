// Norms, RoPE tables (plain and YaRN), masks and attention against values computed here from SPEC.md.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "archspace/model/attention.h"
#include "archspace/model/mlp.h"
#include "archspace/model/rms_norm.h"
#include "archspace/model/rope.h"
#include "tolerance.h"

using namespace archspace;
using archspace::tolerance::within;

TEST(RmsNorm, MatchesDoublePrecisionFormula) {
  at::manual_seed(0);
  at::Tensor x = at::randn({3, 5, 16});
  at::Tensor w = at::randn({16});
  const double eps = 1e-6;
  at::Tensor got = rms_norm(x, w, eps);
  at::Tensor xd = x.to(at::kDouble);
  at::Tensor expected = w.to(at::kDouble) * xd / at::sqrt(xd.pow(2).mean(-1, true) + eps);
  EXPECT_LT((got.to(at::kDouble) - expected).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(got.scalar_type(), at::kFloat);
}

TEST(RmsNorm, Bf16ComputesInFp32AndCastsBack) {
  at::manual_seed(1);
  at::Tensor x = at::randn({4, 32}).to(at::kBFloat16);
  at::Tensor w = at::randn({32});
  at::Tensor got = rms_norm(x, w, 1e-6);
  EXPECT_EQ(got.scalar_type(), at::kBFloat16);
  at::Tensor expected = rms_norm(x.to(at::kFloat), w, 1e-6).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(got, expected));
}

TEST(Rope, PlainInverseFrequencies) {
  const int64_t h = 64;
  const double theta = 500000.0;
  at::Tensor inv = plain_inv_freq(h, theta);
  ASSERT_EQ(inv.size(0), h / 2);
  for (int64_t i = 0; i < h / 2; ++i) {
    double expected = std::pow(theta, -2.0 * i / h);
    EXPECT_NEAR(inv[i].item<float>(), expected, 1e-6 * expected) << "i=" << i;
  }
}

TEST(Rope, TablesAreCosSinOfPositionTimesFrequency) {
  Rope rope{plain_inv_freq(8, 10000.0), 1.0};
  at::Tensor pos = at::arange(0, 50, at::kLong);
  auto [cos, sin] = rope.tables(pos);
  ASSERT_EQ(cos.sizes(), (std::vector<int64_t>{50, 8}));
  for (int64_t t : {0, 1, 17, 49}) {
    for (int64_t i = 0; i < 4; ++i) {
      double angle = t * std::pow(10000.0, -2.0 * i / 8);
      EXPECT_NEAR(cos[t][i].item<float>(), std::cos(angle), 2e-5);
      EXPECT_NEAR(sin[t][i + 4].item<float>(), std::sin(angle), 2e-5);  // rotate-half layout: both halves equal
    }
  }
}

// Decoding reads the kept tables' rows as views (cached_rows) where other calls look positions up (cached_tables):
// the same rows, which are tables() of their positions, also where a later call grows the kept tables.
TEST(Rope, CachedRowsAreTheLookedUpRows) {
  const Rope rope{at::pow(10000.0, -at::arange(0, 16, 2, at::kFloat) / 16.0), 1.0};
  for (const auto& [first, end] : {std::pair<int64_t, int64_t>{0, 5}, {63, 64}, {70, 71}, {100, 140}}) {
    auto [rc, rs] = rope.cached_rows(first, end, 4096, at::kCPU);
    auto [tc, ts] = rope.cached_tables(at::arange(first, end, at::kLong), end, 4096);
    auto [c, s] = rope.tables(at::arange(first, end, at::kLong));
    EXPECT_EQ(rc.sizes(), (std::vector<int64_t>{end - first, 16}));
    EXPECT_TRUE(rc.is_contiguous() && rs.is_contiguous());  // what the fused rope kernels read
    EXPECT_TRUE(at::equal(rc, tc) && at::equal(rs, ts)) << first;
    EXPECT_TRUE(at::equal(rc, c) && at::equal(rs, s)) << first;
  }
}

TEST(Rope, RotationPreservesNormAndRelativeAngle) {
  // <R(m) q, R(n) k> depends only on m - n: the property RoPE exists for.
  Rope rope{plain_inv_freq(16, 10000.0), 1.0};
  at::manual_seed(2);
  at::Tensor q = at::randn({1, 1, 1, 16}), k = at::randn({1, 1, 1, 16});
  auto dot_at = [&](int64_t m, int64_t n) {
    auto [cm, sm] = rope.tables(at::tensor({m}, at::kLong));
    auto [cn, sn] = rope.tables(at::tensor({n}, at::kLong));
    return (apply_rope(q, cm, sm) * apply_rope(k, cn, sn)).sum().item<double>();
  };
  // Two fp32 computations of one exact value: an angle p f (f <= 1) is off by up to (p + 2) u after its
  // product and cos/sin, which moves each rotated entry by twice that relative to its pair; then the
  // products and a 16-term sum, over magnitudes bounded by ||q|| ||k|| (a rotation keeps norms).
  const double qk = q.norm().item<double>() * k.norm().item<double>();
  EXPECT_NEAR(dot_at(5, 2), dot_at(13, 10), 2 * tolerance::chain_bound(16 + 1 + 4 * (13 + 2), qk));
  auto [c, s] = rope.tables(at::tensor({7}, at::kLong));
  EXPECT_NEAR(apply_rope(q, c, s).norm().item<double>(), q.norm().item<double>(),
              tolerance::chain_bound(16 + 2 + 2 * (7 + 2), q.norm().item<double>()));
}

TEST(Yarn, Olmo3LongContextTableForHeadDim128) {
  // SPEC.md section 1: s=8, L0=8192, beta_fast=32, beta_slow=1, h=128 -> low 18, high 35, m = 0.1 ln 8 + 1.
  YarnScaling y;
  y.factor = 8.0;
  y.original_max_position_embeddings = 8192;
  y.beta_fast = 32.0;
  y.beta_slow = 1.0;
  YarnFrequencies f = yarn_inv_freq(128, 500000.0, y);
  EXPECT_EQ(f.low, 18);
  EXPECT_EQ(f.high, 35);
  EXPECT_DOUBLE_EQ(f.attention_factor, 1.2079441541679836);
  ASSERT_EQ(f.inv_freq.size(0), 64);
  for (int64_t i = 0; i < 64; ++i) {
    double ext = std::pow(500000.0, -2.0 * i / 128), inter = ext / 8.0;
    double ramp = std::clamp((i - 18.0) / (35.0 - 18.0), 0.0, 1.0);
    double expected = inter * ramp + ext * (1 - ramp);
    EXPECT_NEAR(f.inv_freq[i].item<float>(), expected, 2e-6 * expected) << "i=" << i;
  }
  // Below the ramp: unchanged (extrapolation); above it: divided by the factor (interpolation).
  EXPECT_NEAR(f.inv_freq[0].item<float>(), 1.0, 1e-7);
  EXPECT_NEAR(f.inv_freq[63].item<float>() * 8.0, std::pow(500000.0, -126.0 / 128), 1e-12);
}

TEST(Yarn, ExplicitAttentionFactorWins) {
  YarnScaling y;
  y.attention_factor = 1.5;
  EXPECT_DOUBLE_EQ(yarn_inv_freq(64, 500000.0, y).attention_factor, 1.5);
}

TEST(Yarn, OnlyFullLayersGetIt) {
  ModelConfig c = preset("tiny");
  c.rope_scaling = YarnScaling{};
  Rope sliding = rope_for(c, LayerType::kSliding), full = rope_for(c, LayerType::kFull);
  EXPECT_TRUE(at::equal(sliding.inv_freq, plain_inv_freq(c.head_dim, c.rope_theta)));
  EXPECT_EQ(sliding.attention_factor, 1.0);
  EXPECT_FALSE(at::equal(full.inv_freq, sliding.inv_freq));
  EXPECT_GT(full.attention_factor, 1.0);
}

TEST(Mask, WindowEdges) {
  // Sliding window W: query i sees keys i-W < j <= i. The key exactly W back is excluded, W-1 back included.
  const int64_t W = 4;
  at::Tensor m = causal_mask(10, 10, W, 0, at::kCPU);
  for (int64_t i = 0; i < 10; ++i) {
    for (int64_t j = 0; j < 10; ++j) {
      bool expected = j <= i && i - j < W;
      EXPECT_EQ(m[i][j].item<bool>(), expected) << "i=" << i << " j=" << j;
    }
  }
  EXPECT_TRUE(m[7][7 - (W - 1)].item<bool>());
  EXPECT_FALSE(m[7][7 - W].item<bool>());
  EXPECT_FALSE(m[3][4].item<bool>());  // never the future
}

TEST(Mask, FullAndOffsetQueries) {
  at::Tensor full = causal_mask(6, 6, 0, 0, at::kCPU);
  EXPECT_TRUE(at::equal(full, at::ones({6, 6}, at::kBool).tril()));
  // Two new queries at positions 8 and 9 over 10 cached keys, window 3: keys 6..8 and 7..9.
  at::Tensor off = causal_mask(2, 10, 3, 8, at::kCPU);
  for (int64_t j = 0; j < 10; ++j) {
    EXPECT_EQ(off[0][j].item<bool>(), j >= 6 && j <= 8) << j;
    EXPECT_EQ(off[1][j].item<bool>(), j >= 7 && j <= 9) << j;
  }
}

namespace {
// Attention by loops over batch, head, query and key, from SPEC.md: the reference for both paths.
at::Tensor loop_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), G = k.size(1);
  at::Tensor out = at::zeros_like(q, at::kDouble);
  auto qa = q.to(at::kDouble), ka = k.to(at::kDouble), va = v.to(at::kDouble);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hh = 0; hh < H; ++hh) {
      const int64_t g = hh / (H / G);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> scores;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j <= i; ++j) {
          if (window > 0 && i - j >= window) continue;
          scores.push_back((qa[b][hh][i] * ka[b][g][j]).sum().item<double>() / std::sqrt(double(D)));
          keys.push_back(j);
        }
        double mx = *std::max_element(scores.begin(), scores.end()), z = 0;
        for (double& s : scores) z += (s = std::exp(s - mx));
        for (size_t n = 0; n < keys.size(); ++n) out[b][hh][i] += va[b][g][keys[n]] * (scores[n] / z);
      }
    }
  return out;
}
}  // namespace

TEST(Attention, SdpaAndReferenceMatchLoopsWithGqaAndWindow) {
  at::manual_seed(3);
  at::Tensor q = at::randn({2, 4, 11, 8}), k = at::randn({2, 2, 11, 8}), v = at::randn({2, 2, 11, 8});
  for (int64_t window : {0, 3, 11, 20}) {
    at::Tensor expected = loop_attention(q, k, v, window);
    for (AttentionImpl impl : {AttentionImpl::kSdpa, AttentionImpl::kReference}) {
      at::Tensor got = causal_attention(q, k, v, window, 0, impl);
      EXPECT_LT((got.to(at::kDouble) - expected).abs().max().item<double>(), 1e-5)
          << "window " << window << " impl " << int(impl);
    }
  }
}

TEST(Attention, OffsetQueriesEqualTheLastRowsOfTheFullComputation) {
  at::manual_seed(4);
  at::Tensor q = at::randn({1, 2, 9, 8}), k = at::randn({1, 2, 9, 8}), v = at::randn({1, 2, 9, 8});
  for (AttentionImpl impl : {AttentionImpl::kSdpa, AttentionImpl::kReference}) {
    at::Tensor full = causal_attention(q, k, v, 4, 0, impl);
    at::Tensor tail = causal_attention(q.narrow(2, 6, 3), k, v, 4, 6, impl);
    EXPECT_TRUE(within(tail, full.narrow(2, 6, 3), tolerance::attention_bound(q, k, v, 4))) << int(impl);
  }
}

TEST(Mlp, SwiGlu) {
  at::manual_seed(5);
  at::Tensor x = at::randn({3, 8}), g = at::randn({12, 8}), u = at::randn({12, 8}), d = at::randn({8, 12});
  at::Tensor gate = at::matmul(x, g.t());
  at::Tensor expected = at::matmul(gate * at::sigmoid(gate) * at::matmul(x, u.t()), d.t());
  // Two fp32 orders (the engine's GEMMs or another kernel's). Each of gate and up is within gamma(8) |x||w|;
  // silu(a) b moves by at most 1.1 |b| da + |silu(a)| db (|silu'| <= 1.1) plus its own 4 roundings; down
  // adds gamma(12) |h||d| and carries those errors through |d|. Twice that for the two computations.
  const at::Tensor gd = gate.to(at::kDouble), ud = at::matmul(x, u.t()).to(at::kDouble);
  const at::Tensor hidden = gd * at::sigmoid(gd) * ud;
  const at::Tensor hidden_error = 1.1 * ud.abs() * tolerance::linear_bound(x, g) +
                                  (gd * at::sigmoid(gd)).abs() * tolerance::linear_bound(x, u) +
                                  tolerance::gamma(4) * hidden.abs();
  const at::Tensor bound = 2 * (tolerance::linear_bound(hidden, d) + at::linear(hidden_error, d.to(at::kDouble).abs()));
  EXPECT_TRUE(within(swiglu_mlp(x, g, u, d), expected, bound));
}
