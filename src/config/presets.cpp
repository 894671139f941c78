// Model presets: the OLMo-core sizes of SPEC.md section 4, plus small ones of the project's own.
#include <map>

#include "archspace/config/model_config.h"
#include "archspace/util/error.h"

namespace archspace {
namespace {

struct Dims {
  int64_t layers, hidden, heads, kv_heads, head_dim, mlp;
};

// OLMo-core sizes: dolma2 vocabulary (100278 ids, padded to 100352 for training), theta 500000,
// eps 1e-6, window 4096, [S, S, S, F] layers.
const std::map<std::string, Dims>& olmo_core_sizes() {
  static const std::map<std::string, Dims> sizes = {
      {"190M", {12, 768, 12, 12, 64, 3072}},  {"370M", {16, 1024, 16, 16, 64, 4096}},
      {"1B", {16, 2048, 16, 16, 128, 8192}},  {"3B", {16, 3328, 16, 16, 208, 13312}},
      {"7B", {32, 4096, 32, 32, 128, 11008}}, {"32B", {64, 5120, 40, 8, 128, 27648}},
  };
  return sizes;
}

ModelConfig from_dims(const Dims& d, Variant variant) {
  ModelConfig c;
  c.variant = variant;
  c.num_hidden_layers = d.layers;
  c.hidden_size = d.hidden;
  c.num_attention_heads = d.heads;
  c.num_key_value_heads = d.kv_heads;
  c.head_dim = d.head_dim;
  c.head_dim_explicit = d.head_dim * d.heads != d.hidden;
  c.intermediate_size = d.mlp;
  c.vocab_size = 100278;
  c.padded_vocab_size = 100352;
  c.sliding_window = 4096;
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-6;
  c.max_position_embeddings = 65536;
  c.layer_types = default_layer_types(d.layers);
  return c;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names = {"tiny", "micro", "small"};
  for (const auto& [name, dims] : olmo_core_sizes()) names.push_back(name);
  return names;
}

ModelConfig preset(const std::string& name, Variant variant) {
  auto it = olmo_core_sizes().find(name);
  if (it != olmo_core_sizes().end()) return from_dims(it->second, variant);
  if (name == "tiny") {
    // Unit tests: a small vocabulary and an 8-token window so sliding and full layers differ early;
    // GQA (4 query heads over 2 kv heads).
    ModelConfig c = from_dims({4, 64, 4, 2, 16, 192}, variant);
    c.vocab_size = 512;
    c.padded_vocab_size = 512;
    c.sliding_window = 8;
    c.max_position_embeddings = 4096;
    c.eos_token_id = 0;
    c.pad_token_id = 1;
    return c;
  }
  if (name == "micro") {
    // The tiny shapes with the real dolma2 vocabulary: minutes-long CPU pipelines on tokenized text.
    ModelConfig c = from_dims({4, 64, 4, 2, 16, 192}, variant);
    c.sliding_window = 32;
    c.max_position_embeddings = 8192;
    return c;
  }
  if (name == "small") {
    // CPU training runs with the real dolma2 vocabulary: 8 layers, d=256, window 128.
    ModelConfig c = from_dims({8, 256, 8, 4, 32, 1024}, variant);
    c.sliding_window = 128;
    c.max_position_embeddings = 8192;
    return c;
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown preset '" + name + "'; known presets: " + known);
}

}  // namespace archspace
