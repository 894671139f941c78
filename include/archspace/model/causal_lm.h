// The OLMo 3 causal language model on LibTorch: parameters named exactly as in Hugging Face checkpoints,
// one device-agnostic forward for CPU and CUDA, fp32 or bf16.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "archspace/config/model_config.h"
#include "archspace/model/kv_cache.h"
#include "archspace/util/tensors.h"
#include "archspace/model/depth_attention.h"
#include "archspace/model/layers.h"
#include "archspace/model/rope.h"

namespace archspace {

enum class ParamKind { kLinear, kEmbedding, kNorm };

struct ParamSpec {
  std::string name;  // HF parameter path, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  ParamKind kind;
};

// Every parameter the model of `config` has, in checkpoint order.
std::vector<ParamSpec> parameter_specs(const ModelConfig& config);
int64_t parameter_count(const ModelConfig& config);

struct ForwardOptions {
  AttentionImpl attention = AttentionImpl::kSdpa;
  // Incremental decoding: the input continues the cached positions, and this call's keys and (mixed)
  // values are added to the cache.
  KVCache* cache = nullptr;
  // Only the last position's logits (prefill for generation: the head is the largest matmul).
  bool last_position_only = false;
};

class CausalLM {
 public:
  // `params` must hold exactly parameter_specs(config), all of one dtype and device.
  CausalLM(ModelConfig config, NamedTensors params);

  // Fresh weights per SPEC.md section 1: truncated normal(0, 0.02) cut at +-3 std for linears and the
  // embedding, ones for norms. Deterministic in `seed`.
  static CausalLM random_init(const ModelConfig& config, uint64_t seed, at::ScalarType dtype = at::kFloat,
                              at::Device device = at::kCPU);

  const ModelConfig& config() const { return config_; }
  const NamedTensors& parameters() const { return params_; }
  const at::Tensor& parameter(const std::string& name) const;
  at::ScalarType dtype() const { return params_.front().second.scalar_type(); }
  at::Device device() const { return params_.front().second.device(); }

  // input_ids [B, T] (int64) -> logits [B, T, vocab_size] in the model's dtype.
  at::Tensor forward(const at::Tensor& input_ids, const ForwardOptions& options = {}) const;

 private:
  bool uses_siamese_norm() const { return config_.variant == Variant::kSiameseDepth && config_.use_siamese_norm; }
  bool uses_depth_attention() const { return config_.variant == Variant::kSiameseDepth && config_.use_depth_attention; }

  struct Layer {
    int64_t index;
    LayerType type;
    at::Tensor q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
    at::Tensor gate_proj, up_proj, down_proj;
    // base block (and the variant with SiameseNorm off)
    at::Tensor post_attention_layernorm, post_feedforward_layernorm;
    // SiameseNorm block
    at::Tensor pre_mlp_layernorm, siamese_attn_pre_norm, siamese_mlp_pre_norm, siamese_mlp_input_norm,
        siamese_hybrid_attn_scale;
  };
  // What one layer's attention needs besides its input.
  struct AttentionContext {
    const at::Tensor& cos;
    const at::Tensor& sin;
    const ForwardOptions& options;
    DepthAttentionState* depth;  // null: no Depth-Attention
  };

  at::Tensor attention(const Layer& layer, const at::Tensor& x, const AttentionContext& ctx) const;
  at::Tensor base_block(const Layer& layer, const at::Tensor& x, const AttentionContext& ctx) const;
  // SiameseNorm "hybrid_pre" block: updates the two residual streams X and Y in place.
  void siamese_block(const Layer& layer, at::Tensor& X, at::Tensor& Y, const AttentionContext& ctx) const;

  ModelConfig config_;
  NamedTensors params_;
  std::map<std::string, size_t> index_;
  at::Tensor embed_tokens_, norm_, lm_head_;
  at::Tensor siamese_post_final_layernorm_, siamese_pre_final_layernorm_;
  std::vector<Layer> layers_;
  Rope sliding_rope_, full_rope_;
};

}  // namespace archspace
