// ModelConfig: every config.json field that changes the maths, read from and written to the Hugging Face
// format (model_type "olmo3" for the base variant, "olmo3_siamese_depth" for the variant).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace archspace {

enum class Variant { kBase, kSiameseDepth };
enum class LayerType { kSliding, kFull };

// Where the block normalises (SPEC.md section 7; config field `norm_topology`). The base variant
// (transformers' Olmo3) is always kReordered; the siamese_depth variant takes any of them.
enum class NormTopology {
  kReordered,         // OLMo 2/3: norm on each sublayer's output, before the residual add
  kPre,               // Pre-Norm
  kPeri,              // Peri-LN: norm on each sublayer's input and output
  kPost,              // Post-Norm: norm after the residual add
  kDeepNorm,          // DeepNet: Post-Norm with the residual scaled by alpha, init scaled by beta
  kHybrid,            // HybridNorm: QKV-norm attention, Post-Norm MLP
  kResidual,          // ResiDual: a Post-Norm stream plus an unnormalised dual stream, fused at the end
  kSiameseHybridPre,  // SiameseNorm "hybrid_pre" (SPEC.md section 3.1)
  kSiamesePostPre,    // SiameseNorm "post_pre"
};
const char* norm_topology_name(NormTopology t);  // the config/TOML spelling: "reordered", "pre", ...
bool is_siamese(NormTopology t);                 // the two-stream SiameseNorm topologies

const char* variant_name(Variant v);       // "base" / "siamese_depth"
const char* model_type_name(Variant v);    // "olmo3" / "olmo3_siamese_depth"
const char* layer_type_name(LayerType t);  // "sliding_attention" / "full_attention"

// YaRN long-context RoPE (SPEC.md section 1). Applies to full-attention layers only.
struct YarnScaling {
  double factor = 8.0;
  int64_t original_max_position_embeddings = 8192;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> attention_factor;  // default: 0.1 * ln(factor) + 1
};

struct ModelConfig {
  Variant variant = Variant::kBase;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // resolved: hidden_size / num_attention_heads unless config.json sets it
  bool head_dim_explicit = false;
  std::vector<LayerType> layer_types;
  int64_t sliding_window = 4096;
  double rope_theta = 500000.0;
  std::optional<YarnScaling> rope_scaling;  // nullopt: plain RoPE on every layer
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 65536;

  // Token ids the tokenizer/generation side needs; they do not change the maths.
  std::optional<int64_t> eos_token_id = 100257;
  std::optional<int64_t> pad_token_id = 100277;
  std::optional<int64_t> bos_token_id;

  // Training-side vocabulary padding (SPEC.md section 1); HF checkpoints carry vocab_size rows.
  int64_t padded_vocab_size = 0;  // 0: same as vocab_size
  double vocab_z_loss_coeff = 1e-5;
  double truncated_normal_factor = 3.0;

  // siamese_depth only (SPEC.md section 3.3).
  bool use_siamese_norm = true;
  bool use_depth_attention = true;
  int64_t depth_attention_stride = 8;
  int64_t depth_attention_recent_window = 0;
  // SPEC.md section 7. nullopt: the compatibility rule (topology()). When set on the variant, it agrees
  // with use_siamese_norm (validate checks).
  std::optional<NormTopology> norm_topology;
  bool siamese_depth_scaling = true;     // SiameseNorm ablation: false sets c_l = 1
  bool siamese_normalized_input = true;  // SiameseNorm ablation: false drops the norm of the fused sublayer input

  int64_t kv_groups() const { return num_attention_heads / num_key_value_heads; }
  // The block's topology: norm_topology when set; else reordered, or siamese_hybrid_pre for the variant
  // with use_siamese_norm (the compatibility rule of SPEC.md section 7).
  NormTopology topology() const;
  // DeepNet's decoder-only constants (Wang et al. 2022, arXiv 2203.00555): alpha = (2L)^(1/4) scales the
  // residual, beta = (8L)^(-1/4) scales v/o/MLP weights at init.
  double deepnorm_alpha() const;
  double deepnorm_beta() const;

  // Throws archspace::Error naming `source` and the first inconsistent field.
  void validate(const std::string& source = "config") const;

  // The architecture's fields where `other` differs from this config, each as "field this -> other": the variant,
  // the sizes, and (when both are siamese_depth) the variant's switches and norm topology. Sequence length, RoPE
  // and token ids are not the architecture (what a stage transition may change).
  std::vector<std::string> architecture_differences(const ModelConfig& other) const;

  nlohmann::json to_json() const;
  // `source` names the file in error messages.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source = "config.json");
  static ModelConfig load(const std::string& path);  // a config.json file
  void save(const std::string& path) const;
};

// The siamese_depth ablation switches (SPEC.md section 3.3) as a user sets them over a preset or a
// config (init flags, TOML keys): unset fields keep the model's value. The one place that rule lives.
struct VariantSwitches {
  std::optional<bool> use_siamese_norm, use_depth_attention;
  std::optional<int64_t> depth_attention_stride, depth_attention_recent_window;
  // norm_topology also sets use_siamese_norm (on for the siamese topologies); use_siamese_norm alone picks
  // siamese_hybrid_pre or reordered. `reordered` is accepted on base (its only topology).
  std::optional<NormTopology> norm_topology;
  std::optional<bool> siamese_depth_scaling, siamese_normalized_input;

  bool any() const {
    return use_siamese_norm || use_depth_attention || depth_attention_stride || depth_attention_recent_window ||
           norm_topology || siamese_depth_scaling || siamese_normalized_input;
  }
  // Throws naming `where` when a switch is set on a model that is not siamese_depth.
  void apply_to(ModelConfig& config, const std::string& where) const;
};

// Presets: OLMo-core sizes of SPEC.md section 4 ("190M" ... "32B") and small ones of our own for tests
// and CPU runs ("tiny", "small"). Throws for an unknown name, listing the known ones.
ModelConfig preset(const std::string& name, Variant variant = Variant::kBase);
std::vector<std::string> preset_names();

// The default OLMo 3 pattern [S, S, S, F] repeated.
std::vector<LayerType> default_layer_types(int64_t num_layers);

}  // namespace archspace
