// The siamese_depth variant: Depth-Attention against plain loops written from SPEC.md section 3.2,
// parameter counts, and fp64 finite-difference gradients through both streams and the depth mixing.
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <cmath>

#include "archspace/model/causal_lm.h"
#include "archspace/model/depth_attention.h"
#include "tolerance.h"

using namespace archspace;

TEST(DepthSources, StrideAndRecentWindow) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(depth_sources(0, 8, 0), V{});
  EXPECT_EQ(depth_sources(1, 8, 0), V{0});
  EXPECT_EQ(depth_sources(8, 8, 0), V{0});  // strictly below l
  EXPECT_EQ(depth_sources(9, 8, 0), (V{0, 8}));
  EXPECT_EQ(depth_sources(15, 8, 0), (V{0, 8}));
  EXPECT_EQ(depth_sources(6, 2, 0), (V{0, 2, 4}));
  EXPECT_EQ(depth_sources(5, 3, 1), (V{0, 3, 4}));
  EXPECT_EQ(depth_sources(6, 3, 2), (V{0, 3, 4, 5}));
}

namespace {

// SPEC.md 3.2 for one token t and kv head g, by loops: qbar = mean of the group's query heads; scores
// qbar . k_j / sqrt(h) over sources then the layer itself; softmax; vhat = sum alpha_j * vhat_j.
// q: [B, H, T, h]; keys/vhats: per layer [B, G, T, h]. Computes vhat of `layer` in double.
at::Tensor loop_depth_mix(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::vector<at::Tensor>& src_k, const std::vector<at::Tensor>& src_vhat) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), h = q.size(3), G = k.size(1), per = H / G;
  at::Tensor qd = q.to(at::kDouble);
  auto qa = qd.accessor<double, 4>();
  at::Tensor out = at::zeros({B, G, T, h}, at::kDouble);
  auto oa = out.accessor<double, 4>();
  std::vector<at::Tensor> keys(src_k), vals(src_vhat);
  keys.push_back(k);
  vals.push_back(v);
  std::vector<at::Tensor> kd, vd;
  for (auto& t : keys) kd.push_back(t.to(at::kDouble));
  for (auto& t : vals) vd.push_back(t.to(at::kDouble));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> qbar(h, 0.0);
        for (int64_t j = 0; j < per; ++j)
          for (int64_t d = 0; d < h; ++d) qbar[d] += qa[b][g * per + j][t][d] / per;
        std::vector<double> scores;
        for (auto& kk : kd) {
          auto ka = kk.accessor<double, 4>();
          double s = 0;
          for (int64_t d = 0; d < h; ++d) s += qbar[d] * ka[b][g][t][d];
          scores.push_back(s / std::sqrt(double(h)));
        }
        double mx = *std::max_element(scores.begin(), scores.end()), z = 0;
        for (double& s : scores) z += (s = std::exp(s - mx));
        for (size_t n = 0; n < vd.size(); ++n) {
          auto va = vd[n].accessor<double, 4>();
          for (int64_t d = 0; d < h; ++d) oa[b][g][t][d] += scores[n] / z * va[b][g][t][d];
        }
      }
  return out;
}

}  // namespace

TEST(DepthAttention, VectorisedMixEqualsLoops) {
  at::manual_seed(0);
  const int64_t B = 2, H = 4, G = 2, T = 5, h = 8;
  at::Tensor q = at::randn({B, H, T, h}), k = at::randn({B, G, T, h}), v = at::randn({B, G, T, h});
  std::vector<at::Tensor> sk = {at::randn({B, G, T, h}), at::randn({B, G, T, h}), at::randn({B, G, T, h})};
  std::vector<at::Tensor> sv = {at::randn({B, G, T, h}), at::randn({B, G, T, h}), at::randn({B, G, T, h})};
  for (size_t n = 0; n <= sk.size(); ++n) {
    std::vector<at::Tensor> ks(sk.begin(), sk.begin() + n), vs(sv.begin(), sv.begin() + n);
    at::Tensor got = depth_attention_mix(q, k, v, ks, vs);
    EXPECT_LT((got.to(at::kDouble) - loop_depth_mix(q, k, v, ks, vs)).abs().max().item<double>(), 1e-6)
        << n << " sources";
  }
  // No sources: the value is its own mix.
  EXPECT_TRUE(at::equal(depth_attention_mix(q, k, v, {}, {}), v));
}

TEST(DepthAttention, RecursiveStateEqualsLoopsOverLayers) {
  // 7 layers, stride 2, recent window 1: layer l mixes {0, 2, 4, ...} below it plus l-1, recursively.
  at::manual_seed(1);
  const int64_t L = 7, stride = 2, recent = 1, B = 1, H = 6, G = 3, T = 4, h = 4;
  std::vector<at::Tensor> qs, ks, vs;
  for (int64_t l = 0; l < L; ++l) {
    qs.push_back(at::randn({B, H, T, h}));
    ks.push_back(at::randn({B, G, T, h}));
    vs.push_back(at::randn({B, G, T, h}));
  }
  DepthAttentionState state(L, stride, recent);
  std::vector<at::Tensor> expected_vhat(L);
  for (int64_t l = 0; l < L; ++l) {
    at::Tensor got = state.mix(l, qs[l], ks[l], vs[l]);
    std::vector<at::Tensor> src_k, src_v;
    for (int64_t j = 0; j < l; ++j) {
      if (j % stride == 0 || j >= l - recent) {
        src_k.push_back(ks[j]);
        src_v.push_back(expected_vhat[j]);
      }
    }
    expected_vhat[l] = loop_depth_mix(qs[l], ks[l], vs[l], src_k, src_v).to(at::kFloat);
    EXPECT_LT((got - expected_vhat[l]).abs().max().item<float>(), 1e-5) << "layer " << l;
  }
}

TEST(ParameterCount, DepthAttentionAddsNoneSiameseNormMatchesFormula) {
  for (const char* name : {"tiny", "190M", "1B"}) {
    ModelConfig base = preset(name, Variant::kBase);
    ModelConfig v = preset(name, Variant::kSiameseDepth);
    const int64_t d = v.hidden_size, L = v.num_hidden_layers;
    v.use_depth_attention = false;
    const int64_t without_depth = parameter_count(v);
    v.use_depth_attention = true;
    EXPECT_EQ(parameter_count(v), without_depth) << name;
    // SiameseNorm: per layer 4 norms + 1 scale vector (5d) replace the 2 post norms (2d); plus 2 final norms.
    EXPECT_EQ(parameter_count(v), parameter_count(base) + L * (5 * d - 2 * d) + 2 * d) << name;
    v.use_siamese_norm = false;
    EXPECT_EQ(parameter_count(v), parameter_count(base)) << name;
  }
}

TEST(Variant, BothSwitchesOffIsTheBaseModel) {
  ModelConfig base = preset("tiny");
  ModelConfig v = preset("tiny", Variant::kSiameseDepth);
  v.use_siamese_norm = v.use_depth_attention = false;
  CausalLM a = CausalLM::random_init(base, 3);
  CausalLM b(v, a.parameters());
  at::Tensor ids = at::randint(0, 512, {1, 20}, at::kLong);
  EXPECT_TRUE(at::equal(a.forward(ids), b.forward(ids)));
}

TEST(Variant, BatchEqualsRowsAndCausal) {
  ModelConfig c = preset("tiny", Variant::kSiameseDepth);
  c.num_hidden_layers = 5;
  c.layer_types = default_layer_types(5);
  c.depth_attention_stride = 2;
  CausalLM m = CausalLM::random_init(c, 4);
  at::Tensor ids = at::randint(0, 512, {2, 16}, at::kLong);
  at::Tensor batch = m.forward(ids);
  for (int64_t b = 0; b < 2; ++b)
    EXPECT_TRUE(tolerance::within(batch[b], m.forward(ids.narrow(0, b, 1))[0], tolerance::forward_bound(m, 16)));
  at::Tensor changed = ids.clone();
  changed[0][10] = (ids[0][10].item<int64_t>() + 1) % 512;
  EXPECT_TRUE(at::equal(m.forward(changed)[0].narrow(0, 0, 10), batch[0].narrow(0, 0, 10)));
}

TEST(Variant, FiniteDifferenceGradientsFp64) {
  // fp64 central differences against autograd through both SiameseNorm streams and recursive depth
  // mixing (5 layers, stride 2, recent window 1, GQA, window shorter than the sequence).
  // Step 1e-6: truncation error ~eps^2 * f''' ~ 1e-12, rounding ~1e-16 / 1e-6 = 1e-10; the check allows
  // 1e-6 relative + 1e-8 absolute.
  ModelConfig c = preset("tiny", Variant::kSiameseDepth);
  c.num_hidden_layers = 5;
  c.layer_types = default_layer_types(5);
  c.depth_attention_stride = 2;
  c.depth_attention_recent_window = 1;
  c.sliding_window = 4;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 48;
  c.vocab_size = 40;
  c.padded_vocab_size = 40;
  c.rope_scaling = YarnScaling{4.0, 16, 32.0, 1.0, std::nullopt};
  CausalLM init = CausalLM::random_init(c, 5, at::kDouble);
  // Perturb norms and scales away from 1 so that their gradients are generic.
  at::manual_seed(6);
  NamedTensors params;
  for (const auto& [n, t] : init.parameters()) {
    at::Tensor p = t.dim() == 1 ? t + 0.3 * at::randn_like(t) : t * 5;  // weights ~0.1: non-trivial attention
    params.emplace_back(n, p.detach().requires_grad_(true));
  }
  CausalLM model(c, params);
  at::Tensor ids = at::randint(0, c.vocab_size, {2, 9}, at::kLong);
  at::Tensor probe = at::randn({2, 9, c.vocab_size}, at::kDouble);
  auto objective = [&]() { return (model.forward(ids, SequenceOptions{AttentionImpl::kReference}) * probe).sum(); };
  objective().backward();

  const std::vector<std::string> checked = {
      "model.embed_tokens.weight",
      "model.layers.0.siamese_hybrid_attn_scale",
      "model.layers.1.self_attn.v_proj.weight",  // values feed the depth mix of layers 2, 3, 4
      "model.layers.2.self_attn.k_proj.weight",  // keys feed depth scores
      "model.layers.2.self_attn.q_norm.weight",
      "model.layers.3.pre_mlp_layernorm.weight",
      "model.layers.3.siamese_attn_pre_norm.weight",
      "model.layers.4.siamese_mlp_pre_norm.weight",
      "model.layers.4.siamese_mlp_input_norm.weight",
      "model.layers.4.mlp.down_proj.weight",
      "model.siamese_post_final_layernorm.weight",
      "model.siamese_pre_final_layernorm.weight",
      "model.norm.weight",
      "lm_head.weight",
  };
  const double eps = 1e-6;
  at::Generator gen = at::detail::createCPUGenerator(7);
  int nontrivial = 0, total = 0;  // a check of near-zero gradients would prove nothing
  for (const auto& name : checked) {
    at::Tensor p = model.parameter(name);
    at::Tensor flat = p.detach().view({-1});  // shares storage with the parameter
    at::Tensor grad = p.grad().view({-1});
    for (int sample = 0; sample < 3; ++sample) {
      int64_t i = at::randint(flat.numel(), {1}, gen, at::kLong).item<int64_t>();
      if (name == "model.embed_tokens.weight")
        i = ids[0][sample].item<int64_t>() * c.hidden_size + sample;  // a used row
      const double saved = flat[i].item<double>();
      double plus, minus;
      {
        c10::NoGradGuard no_grad;
        flat[i] = saved + eps;
        plus = objective().item<double>();
        flat[i] = saved - eps;
        minus = objective().item<double>();
        flat[i] = saved;
      }
      const double numeric = (plus - minus) / (2 * eps), analytic = grad[i].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-6 * std::abs(numeric) + 1e-8) << name << "[" << i << "]";
      nontrivial += std::abs(numeric) > 1e-4;
      ++total;
    }
  }
  EXPECT_GE(nontrivial, total * 3 / 4) << "most probed gradients should be far from zero";
}
