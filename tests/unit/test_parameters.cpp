// The parameter tables (model/parameters.h): the checkpoint names, shapes, kinds and order they produce
// are exactly those of the hand-written list they replaced, and CausalLM binds every layer tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "archspace/config/choices.h"
#include "archspace/model/causal_lm.h"

using namespace archspace;

namespace {

// parameter_specs as it was written by hand before the tables (commit fb4e38a), kept verbatim as the
// reference: checkpoints and optimizer state depend on these names and this order.
std::vector<ParamSpec> handwritten_parameter_specs(const ModelConfig& c) {
  const int64_t d = c.hidden_size, q_width = c.num_attention_heads * c.head_dim,
                kv_width = c.num_key_value_heads * c.head_dim;
  const bool siamese = c.variant == Variant::kSiameseDepth && c.use_siamese_norm;
  std::vector<ParamSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, d}, ParamKind::kEmbedding});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    specs.push_back({p + "self_attn.q_proj.weight", {q_width, d}, ParamKind::kLinear});
    specs.push_back({p + "self_attn.k_proj.weight", {kv_width, d}, ParamKind::kLinear});
    specs.push_back({p + "self_attn.v_proj.weight", {kv_width, d}, ParamKind::kLinear});
    specs.push_back({p + "self_attn.o_proj.weight", {d, q_width}, ParamKind::kLinear});
    specs.push_back({p + "self_attn.q_norm.weight", {q_width}, ParamKind::kNorm});
    specs.push_back({p + "self_attn.k_norm.weight", {kv_width}, ParamKind::kNorm});
    specs.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, d}, ParamKind::kLinear});
    specs.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, d}, ParamKind::kLinear});
    specs.push_back({p + "mlp.down_proj.weight", {d, c.intermediate_size}, ParamKind::kLinear});
    if (siamese) {
      specs.push_back({p + "pre_mlp_layernorm.weight", {d}, ParamKind::kNorm});
      specs.push_back({p + "siamese_attn_pre_norm.weight", {d}, ParamKind::kNorm});
      specs.push_back({p + "siamese_mlp_pre_norm.weight", {d}, ParamKind::kNorm});
      specs.push_back({p + "siamese_mlp_input_norm.weight", {d}, ParamKind::kNorm});
      specs.push_back({p + "siamese_hybrid_attn_scale", {d}, ParamKind::kNorm});
    } else {
      specs.push_back({p + "post_attention_layernorm.weight", {d}, ParamKind::kNorm});
      specs.push_back({p + "post_feedforward_layernorm.weight", {d}, ParamKind::kNorm});
    }
  }
  if (siamese) {
    specs.push_back({"model.siamese_post_final_layernorm.weight", {d}, ParamKind::kNorm});
    specs.push_back({"model.siamese_pre_final_layernorm.weight", {d}, ParamKind::kNorm});
  }
  specs.push_back({"model.norm.weight", {d}, ParamKind::kNorm});
  specs.push_back({"lm_head.weight", {c.vocab_size, d}, ParamKind::kLinear});
  return specs;
}

// Every variant and switch combination, on presets with MHA/GQA and head_dim != d / H.
std::vector<ModelConfig> configs() {
  std::vector<ModelConfig> out;
  for (const char* name : {"tiny", "190M", "1B"}) {
    out.push_back(preset(name, Variant::kBase));
    for (bool siamese : {true, false}) {
      for (bool depth : {true, false}) {
        ModelConfig c = preset(name, Variant::kSiameseDepth);
        c.use_siamese_norm = siamese;
        c.use_depth_attention = depth;
        out.push_back(c);
      }
    }
  }
  ModelConfig odd = preset("tiny", Variant::kSiameseDepth);
  odd.head_dim = 24;  // q width 96 != d = 64
  odd.num_key_value_heads = 1;
  out.push_back(odd);
  return out;
}

std::string describe(const ModelConfig& c) {
  return std::string(c.variant == Variant::kBase ? "base" : "siamese_depth") + " d=" + std::to_string(c.hidden_size) +
         " siamese=" + std::to_string(c.use_siamese_norm) + " depth=" + std::to_string(c.use_depth_attention);
}

// The rows' members are distinct: with the static_asserts on struct sizes (one row per member), every
// member has exactly one row.
template <class Rows>
void expect_distinct_members(const Rows& rows, const char* table) {
  for (size_t i = 0; i < std::size(rows); ++i)
    for (size_t j = i + 1; j < std::size(rows); ++j)
      EXPECT_NE(rows[i].member, rows[j].member) << table << ": rows " << rows[i].name << " and " << rows[j].name;
}

// Each row's member of `weights` is the very tensor the model holds under that name.
template <class W, class Rows>
void expect_bound(const CausalLM& m, const W& weights, const Rows& rows, const std::string& prefix) {
  for (const auto& row : rows) {
    const at::Tensor& bound = weights.*row.member;
    ASSERT_TRUE(bound.defined()) << prefix + row.name;
    EXPECT_TRUE(bound.is_same(m.parameter(prefix + row.name))) << prefix + row.name;
  }
}

}  // namespace

TEST(ParameterTables, SpecsEqualTheHandwrittenList) {
  for (const ModelConfig& c : configs()) {
    const auto got = parameter_specs(c), want = handwritten_parameter_specs(c);
    ASSERT_EQ(got.size(), want.size()) << describe(c);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].name, want[i].name) << describe(c) << " #" << i;
      EXPECT_EQ(got[i].shape, want[i].shape) << describe(c) << " " << want[i].name;
      EXPECT_EQ(got[i].kind, want[i].kind) << describe(c) << " " << want[i].name;
    }
  }
}

TEST(ParameterTables, EveryStructMemberHasOneRow) {
  using namespace param_tables;
  expect_distinct_members(kAttentionMlpRows, "attention/MLP");
  expect_distinct_members(kBlockNormRows, "block norms");
  expect_distinct_members(kFinalNormRows, "final norms");
  ASSERT_EQ(std::size(kEmbeddingRows), 1u);
  for (const auto& row : kHeadRows) EXPECT_NE(row.member, kEmbeddingRows[0].member) << row.name;
  EXPECT_NE(kHeadRows[0].member, kHeadRows[1].member);
}

// The configs above plus every topology of SPEC.md section 7 (and the SiameseNorm ablations) on the variant.
std::vector<ModelConfig> configs_with_topologies() {
  std::vector<ModelConfig> out = configs();
  for (const std::string& name : norm_topology_choices()) {
    ModelConfig c = preset("tiny", Variant::kSiameseDepth);
    VariantSwitches s;
    s.norm_topology = parse_norm_topology(name, "test");
    s.apply_to(c, "test");
    out.push_back(c);
    if (is_siamese(c.topology())) {
      ModelConfig a = c;
      a.siamese_normalized_input = false;
      out.push_back(a);
      a.siamese_depth_scaling = false;
      out.push_back(a);
    }
  }
  return out;
}

TEST(ParameterTables, ModelBindsEveryLayerTensor) {
  using namespace param_tables;
  for (ModelConfig c : configs_with_topologies()) {
    if (c.hidden_size > 64) continue;  // binding does not depend on size; keep the test fast
    c.num_hidden_layers = 3;
    c.layer_types = default_layer_types(3);
    const CausalLM m = CausalLM::random_init(c, 1);
    const std::string what = describe(c) + " " + norm_topology_name(c.topology());
    ASSERT_EQ(m.layers().size(), 3u) << what;
    const auto rows = block_norm_rows(c);
    for (int64_t l = 0; l < 3; ++l) {
      expect_bound(m, m.layers()[l], kAttentionMlpRows, layer_prefix(l));
      for (const auto* row : rows) {
        const at::Tensor& bound = m.layers()[l].*(row->member);
        ASSERT_TRUE(bound.defined()) << what << " " << row->name;
        EXPECT_TRUE(bound.is_same(m.parameter(layer_prefix(l) + row->name))) << what << " " << row->name;
      }
      // The norms of other topologies stay unbound (a block reading one would fail loudly, not silently).
      for (const auto& row : kBlockNormRows) {
        const bool own = std::any_of(rows.begin(), rows.end(), [&](const auto* r) { return r->member == row.member; });
        EXPECT_EQ((m.layers()[l].*row.member).defined(), own) << what << " " << row.name;
      }
    }
    for (const auto* row : final_norm_rows(c))
      EXPECT_TRUE((m.final_norms().*(row->member)).is_same(m.parameter(row->name)));
  }
}

// Each topology's parameter names, as SPEC.md section 7 lists its norms, in checkpoint order per layer.
TEST(ParameterTables, TopologyKeyspaces) {
  const std::map<std::string, std::vector<std::string>> layer_norms = {
      {"reordered", {"post_attention_layernorm.weight", "post_feedforward_layernorm.weight"}},
      {"pre", {"input_layernorm.weight", "pre_feedforward_layernorm.weight"}},
      {"peri",
       {"input_layernorm.weight", "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight",
        "post_feedforward_layernorm.weight"}},
      {"post", {"post_attention_layernorm.weight", "post_feedforward_layernorm.weight"}},
      {"deepnorm", {"post_attention_layernorm.weight", "post_feedforward_layernorm.weight"}},
      {"hybrid", {"self_attn.v_norm.weight", "pre_feedforward_layernorm.weight"}},
      {"residual", {"post_attention_layernorm.weight", "post_feedforward_layernorm.weight"}},
      {"siamese_hybrid_pre",
       {"pre_mlp_layernorm.weight", "siamese_attn_pre_norm.weight", "siamese_mlp_pre_norm.weight",
        "siamese_mlp_input_norm.weight", "siamese_hybrid_attn_scale"}},
      {"siamese_post_pre",
       {"siamese_attn_pre_norm.weight", "siamese_attn_input_norm.weight", "post_attention_layernorm.weight",
        "siamese_mlp_pre_norm.weight", "siamese_mlp_input_norm.weight", "post_feedforward_layernorm.weight"}},
  };
  ASSERT_EQ(layer_norms.size(), norm_topology_choices().size());
  for (const auto& [name, norms] : layer_norms) {
    ModelConfig c = preset("tiny", Variant::kSiameseDepth);
    VariantSwitches s;
    s.norm_topology = parse_norm_topology(name, "test");
    s.apply_to(c, "test");
    c.validate();
    const auto specs = parameter_specs(c);
    std::vector<std::string> got;
    for (const auto& spec : specs) {
      const std::string p = "model.layers.1.";
      if (spec.name.rfind(p, 0) == 0 && spec.name.find("proj") == std::string::npos &&
          spec.name.find("q_norm") == std::string::npos && spec.name.find("k_norm") == std::string::npos)
        got.push_back(spec.name.substr(p.size()));
    }
    EXPECT_EQ(got, norms) << name;
    const bool siamese = name.rfind("siamese_", 0) == 0;
    const size_t base_count = 1 + 4 * (9 + norms.size()) + 2;
    const size_t final_count = siamese ? 2 : name == "residual" ? 1 : 0;
    EXPECT_EQ(specs.size(), base_count + final_count) << name;
    if (name == "hybrid") {
      for (const auto& spec : specs) {
        if (spec.name == "model.layers.0.self_attn.v_norm.weight") {
          EXPECT_EQ(spec.shape, std::vector<int64_t>{c.num_key_value_heads * c.head_dim});
        }
      }
    }
  }
}
