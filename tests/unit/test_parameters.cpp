// The parameter tables (model/parameters.h): the checkpoint names, shapes, kinds and order they produce
// are exactly those of the hand-written list they replaced, and CausalLM binds every layer tensor.
#include <gtest/gtest.h>

#include <set>

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
  expect_distinct_members(kBaseBlockRows, "base block");
  expect_distinct_members(kSiameseBlockRows, "SiameseNorm block");
  expect_distinct_members(kSiameseFinalRows, "SiameseNorm final");
  ASSERT_EQ(std::size(kEmbeddingRows), 1u);
  for (const auto& row : kHeadRows) EXPECT_NE(row.member, kEmbeddingRows[0].member) << row.name;
  EXPECT_NE(kHeadRows[0].member, kHeadRows[1].member);
}

TEST(ParameterTables, ModelBindsEveryLayerTensor) {
  using namespace param_tables;
  for (ModelConfig c : configs()) {
    if (c.hidden_size > 64) continue;  // binding does not depend on size; keep the test fast
    c.num_hidden_layers = 3;
    c.layer_types = default_layer_types(3);
    const CausalLM m = CausalLM::random_init(c, 1);
    const bool siamese = c.variant == Variant::kSiameseDepth && c.use_siamese_norm;
    ASSERT_EQ(m.base_layers().size(), siamese ? 0u : 3u) << describe(c);
    ASSERT_EQ(m.siamese_layers().size(), siamese ? 3u : 0u) << describe(c);
    for (int64_t l = 0; l < 3; ++l) {
      if (siamese) {
        expect_bound(m, m.siamese_layers()[l], kAttentionMlpRows, layer_prefix(l));
        expect_bound(m, m.siamese_layers()[l], kSiameseBlockRows, layer_prefix(l));
      } else {
        expect_bound(m, m.base_layers()[l], kAttentionMlpRows, layer_prefix(l));
        expect_bound(m, m.base_layers()[l], kBaseBlockRows, layer_prefix(l));
      }
    }
  }
}
