// The model's parameters, declared once (SPEC.md sections 1, 3.1 and 7).
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
  double init_scale = 1.0;  // multiplies the init draw (DeepNorm's beta on v/o/MLP weights); 1 elsewhere
};

// Every parameter the model of `config` has, in checkpoint order: the embedding; per layer the
// attention/MLP rows then the block's norms; the topology's final-norm rows (SiameseNorm's two stream norms,
// ResiDual's dual norm); the final norm and the LM head.
std::vector<ParamSpec> parameter_specs(const ModelConfig& config);
int64_t parameter_count(const ModelConfig& config);

// ---- the weights each block reads ----------------------------------------------------------------------

// Every block kind: attention (with Q/K norm over the whole projection width) and the SwiGLU MLP.
struct LayerWeights {
  at::Tensor q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
  at::Tensor gate_proj, up_proj, down_proj;
};
// The norms (and SiameseNorm's scale vector) a block may read, SPEC.md sections 3.1 and 7. Each topology
// binds its own rows (block_norm_rows); the others stay undefined.
struct BlockNorms {
  at::Tensor input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm;
  at::Tensor v_norm;  // HybridNorm: RMSNorm over the full V projection width
  at::Tensor pre_mlp_layernorm, siamese_attn_pre_norm, siamese_attn_input_norm, siamese_mlp_pre_norm,
      siamese_mlp_input_norm, siamese_hybrid_attn_scale;
};
struct BlockWeights : LayerWeights, BlockNorms {};
struct ModelWeights {
  at::Tensor embed_tokens, norm, lm_head;
};
// Norms before the final one: SiameseNorm's per-stream norms (RMS_post(X) + RMS_pre(Y)), ResiDual's dual-stream
// norm (x + RMS_dual(d)). Bound per topology (final_norm_rows).
struct FinalNorms {
  at::Tensor siamese_post_final_layernorm, siamese_pre_final_layernorm, residual_dual_norm;
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
// Every block norm, once; which of them a block has is the topology's (block_norm_rows).
inline constexpr ParamRow<BlockNorms> kBlockNormRows[] = {
    {"input_layernorm.weight", {kHidden}, kNorm, &BlockNorms::input_layernorm},
    {"post_attention_layernorm.weight", {kHidden}, kNorm, &BlockNorms::post_attention_layernorm},
    {"pre_feedforward_layernorm.weight", {kHidden}, kNorm, &BlockNorms::pre_feedforward_layernorm},
    {"post_feedforward_layernorm.weight", {kHidden}, kNorm, &BlockNorms::post_feedforward_layernorm},
    {"self_attn.v_norm.weight", {kKvWidth}, kNorm, &BlockNorms::v_norm},
    {"pre_mlp_layernorm.weight", {kHidden}, kNorm, &BlockNorms::pre_mlp_layernorm},
    {"siamese_attn_pre_norm.weight", {kHidden}, kNorm, &BlockNorms::siamese_attn_pre_norm},
    {"siamese_attn_input_norm.weight", {kHidden}, kNorm, &BlockNorms::siamese_attn_input_norm},
    {"siamese_mlp_pre_norm.weight", {kHidden}, kNorm, &BlockNorms::siamese_mlp_pre_norm},
    {"siamese_mlp_input_norm.weight", {kHidden}, kNorm, &BlockNorms::siamese_mlp_input_norm},
    // A scale vector, not a norm, but initialised like one (ones) and not weight-decayed by default.
    {"siamese_hybrid_attn_scale", {kHidden}, kNorm, &BlockNorms::siamese_hybrid_attn_scale},
};
inline constexpr ParamRow<FinalNorms> kFinalNormRows[] = {
    {"model.siamese_post_final_layernorm.weight", {kHidden}, kNorm, &FinalNorms::siamese_post_final_layernorm},
    {"model.siamese_pre_final_layernorm.weight", {kHidden}, kNorm, &FinalNorms::siamese_pre_final_layernorm},
    {"model.residual_dual_norm.weight", {kHidden}, kNorm, &FinalNorms::residual_dual_norm},
};
inline constexpr ParamRow<ModelWeights> kHeadRows[] = {
    {"model.norm.weight", {kHidden}, kNorm, &ModelWeights::norm},
    {"lm_head.weight", {kVocab, kHidden}, kLinear, &ModelWeights::lm_head},
};

// Every member has a row (the structs hold tensors only; unit tests check the rows' members are distinct).
constexpr size_t kTensorSize = sizeof(at::Tensor);
static_assert(sizeof(LayerWeights) == std::size(kAttentionMlpRows) * kTensorSize);
static_assert(sizeof(BlockNorms) == std::size(kBlockNormRows) * kTensorSize);
static_assert(sizeof(BlockWeights) == sizeof(LayerWeights) + sizeof(BlockNorms));
static_assert(sizeof(ModelWeights) == (std::size(kEmbeddingRows) + std::size(kHeadRows)) * kTensorSize);
static_assert(sizeof(FinalNorms) == std::size(kFinalNormRows) * kTensorSize);
}  // namespace param_tables

// The block norms a model of `config` has, in checkpoint order (SPEC.md section 7, "norms per layer";
// SiameseNorm's normalized-input ablation drops the fused-input norms), and its FinalNorms rows.
std::vector<const ParamRow<BlockNorms>*> block_norm_rows(const ModelConfig& config);
std::vector<const ParamRow<FinalNorms>*> final_norm_rows(const ModelConfig& config);

// Sets each row's member of `weights` to lookup(prefix + row.name). W may derive from the rows' struct.
template <class W, class Rows, class Lookup>
void bind_parameters(W& weights, const Rows& rows, const std::string& prefix, const Lookup& lookup) {
  for (const auto& row : rows) weights.*row.member = lookup(prefix + row.name);
}
template <class W, class Row, class Lookup>
void bind_parameters(W& weights, const std::vector<const Row*>& rows, const std::string& prefix, const Lookup& lookup) {
  for (const Row* row : rows) weights.*(row->member) = lookup(prefix + row->name);
}

// "model.layers.{l}.": the prefix of layer l's parameter and activation names.
inline std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

}  // namespace archspace
