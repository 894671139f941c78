// The model's parameters, declared once per block kind (SPEC.md sections 1 and 3.1).
//
// Each table row names one parameter: its checkpoint name (after "model.layers.{l}." for layer rows), its
// shape in config dimensions, its init kind, and the member of the block's weight struct it binds.
// parameter_specs() (checkpoint names, shapes and order) and CausalLM (which tensor each block reads) both
// read these tables, so a parameter is written down in exactly one place. A struct member without a row
// fails to compile (the static_asserts below).
#pragma once

#include <ATen/ATen.h>

#include <iterator>
#include <string>
#include <vector>

#include "archspace/config/model_config.h"

namespace archspace {

enum class ParamKind { kLinear, kEmbedding, kNorm };  // decides the init (SPEC.md section 1)

struct ParamSpec {
  std::string name;  // HF parameter path, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  ParamKind kind;
};

// Every parameter the model of `config` has, in checkpoint order: the embedding; per layer the
// attention/MLP rows then the block's own rows; with SiameseNorm the two final stream norms; the final norm
// and the LM head.
std::vector<ParamSpec> parameter_specs(const ModelConfig& config);
int64_t parameter_count(const ModelConfig& config);

// ---- the weights each block reads ----------------------------------------------------------------------

// Every block kind: attention (with Q/K norm over the whole projection width) and the SwiGLU MLP.
struct LayerWeights {
  at::Tensor q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
  at::Tensor gate_proj, up_proj, down_proj;
};
// The base OLMo 3 block (and the variant with SiameseNorm off): norms on each sublayer's output.
struct BaseLayerWeights : LayerWeights {
  at::Tensor post_attention_layernorm, post_feedforward_layernorm;
};
// The SiameseNorm "hybrid_pre" block (SPEC.md section 3.1).
struct SiameseLayerWeights : LayerWeights {
  at::Tensor pre_mlp_layernorm, siamese_attn_pre_norm, siamese_mlp_pre_norm, siamese_mlp_input_norm,
      siamese_hybrid_attn_scale;
};
struct ModelWeights {
  at::Tensor embed_tokens, norm, lm_head;
};
// With SiameseNorm the final norm reads RMS_post(X) + RMS_pre(Y).
struct SiameseFinalWeights {
  at::Tensor siamese_post_final_layernorm, siamese_pre_final_layernorm;
};

// ---- the tables ----------------------------------------------------------------------------------------

enum class Dim { kHidden, kQueryWidth, kKvWidth, kIntermediate, kVocab };  // d, H*h, G*h, I, V

struct ParamShape {
  constexpr ParamShape(Dim rows) : dims{rows, rows}, rank(1) {}
  constexpr ParamShape(Dim rows, Dim cols) : dims{rows, cols}, rank(2) {}
  std::vector<int64_t> resolve(const ModelConfig& c) const;
  Dim dims[2];
  int rank;
};

template <class Weights>
struct ParamRow {
  const char* name;
  ParamShape shape;  // nn.Linear layout [out, in]
  ParamKind kind;
  at::Tensor Weights::*member;
};

namespace param_tables {
using enum Dim;
using enum ParamKind;

inline constexpr ParamRow<ModelWeights> kEmbeddingRows[] = {
    {"model.embed_tokens.weight", {kVocab, kHidden}, kEmbedding, &ModelWeights::embed_tokens},
};
inline constexpr ParamRow<LayerWeights> kAttentionMlpRows[] = {
    {"self_attn.q_proj.weight", {kQueryWidth, kHidden}, kLinear, &LayerWeights::q_proj},
    {"self_attn.k_proj.weight", {kKvWidth, kHidden}, kLinear, &LayerWeights::k_proj},
    {"self_attn.v_proj.weight", {kKvWidth, kHidden}, kLinear, &LayerWeights::v_proj},
    {"self_attn.o_proj.weight", {kHidden, kQueryWidth}, kLinear, &LayerWeights::o_proj},
    {"self_attn.q_norm.weight", {kQueryWidth}, kNorm, &LayerWeights::q_norm},
    {"self_attn.k_norm.weight", {kKvWidth}, kNorm, &LayerWeights::k_norm},
    {"mlp.gate_proj.weight", {kIntermediate, kHidden}, kLinear, &LayerWeights::gate_proj},
    {"mlp.up_proj.weight", {kIntermediate, kHidden}, kLinear, &LayerWeights::up_proj},
    {"mlp.down_proj.weight", {kHidden, kIntermediate}, kLinear, &LayerWeights::down_proj},
};
inline constexpr ParamRow<BaseLayerWeights> kBaseBlockRows[] = {
    {"post_attention_layernorm.weight", {kHidden}, kNorm, &BaseLayerWeights::post_attention_layernorm},
    {"post_feedforward_layernorm.weight", {kHidden}, kNorm, &BaseLayerWeights::post_feedforward_layernorm},
};
inline constexpr ParamRow<SiameseLayerWeights> kSiameseBlockRows[] = {
    {"pre_mlp_layernorm.weight", {kHidden}, kNorm, &SiameseLayerWeights::pre_mlp_layernorm},
    {"siamese_attn_pre_norm.weight", {kHidden}, kNorm, &SiameseLayerWeights::siamese_attn_pre_norm},
    {"siamese_mlp_pre_norm.weight", {kHidden}, kNorm, &SiameseLayerWeights::siamese_mlp_pre_norm},
    {"siamese_mlp_input_norm.weight", {kHidden}, kNorm, &SiameseLayerWeights::siamese_mlp_input_norm},
    // A scale vector, not a norm, but initialised like one (ones) and not weight-decayed by default.
    {"siamese_hybrid_attn_scale", {kHidden}, kNorm, &SiameseLayerWeights::siamese_hybrid_attn_scale},
};
inline constexpr ParamRow<SiameseFinalWeights> kSiameseFinalRows[] = {
    {"model.siamese_post_final_layernorm.weight", {kHidden}, kNorm, &SiameseFinalWeights::siamese_post_final_layernorm},
    {"model.siamese_pre_final_layernorm.weight", {kHidden}, kNorm, &SiameseFinalWeights::siamese_pre_final_layernorm},
};
inline constexpr ParamRow<ModelWeights> kHeadRows[] = {
    {"model.norm.weight", {kHidden}, kNorm, &ModelWeights::norm},
    {"lm_head.weight", {kVocab, kHidden}, kLinear, &ModelWeights::lm_head},
};

// Every member has a row (the structs hold tensors only; unit tests check the rows' members are distinct).
constexpr size_t kTensorSize = sizeof(at::Tensor);
static_assert(sizeof(LayerWeights) == std::size(kAttentionMlpRows) * kTensorSize);
static_assert(sizeof(BaseLayerWeights) == (std::size(kAttentionMlpRows) + std::size(kBaseBlockRows)) * kTensorSize);
static_assert(sizeof(SiameseLayerWeights) ==
              (std::size(kAttentionMlpRows) + std::size(kSiameseBlockRows)) * kTensorSize);
static_assert(sizeof(ModelWeights) == (std::size(kEmbeddingRows) + std::size(kHeadRows)) * kTensorSize);
static_assert(sizeof(SiameseFinalWeights) == std::size(kSiameseFinalRows) * kTensorSize);
}  // namespace param_tables

// Sets each row's member of `weights` to lookup(prefix + row.name). W may derive from the rows' struct.
template <class W, class Rows, class Lookup>
void bind_parameters(W& weights, const Rows& rows, const std::string& prefix, const Lookup& lookup) {
  for (const auto& row : rows) weights.*row.member = lookup(prefix + row.name);
}

// "model.layers.{l}.": the prefix of layer l's parameter and activation names.
inline std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

}  // namespace archspace
