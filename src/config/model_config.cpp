#include "archspace/config/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "archspace/config/choices.h"
#include "archspace/util/error.h"
#include "archspace/util/file_writer.h"
#include "archspace/util/json_file.h"
#include "archspace/util/strings.h"

namespace archspace {

using nlohmann::json;

const char* variant_name(Variant v) { return v == Variant::kBase ? "base" : "siamese_depth"; }
const char* model_type_name(Variant v) { return v == Variant::kBase ? "olmo3" : "olmo3_siamese_depth"; }
const char* layer_type_name(LayerType t) { return t == LayerType::kSliding ? "sliding_attention" : "full_attention"; }

const char* norm_topology_name(NormTopology t) {
  switch (t) {
    case NormTopology::kReordered:
      return "reordered";
    case NormTopology::kPre:
      return "pre";
    case NormTopology::kPeri:
      return "peri";
    case NormTopology::kPost:
      return "post";
    case NormTopology::kDeepNorm:
      return "deepnorm";
    case NormTopology::kHybrid:
      return "hybrid";
    case NormTopology::kResidual:
      return "residual";
    case NormTopology::kSiameseHybridPre:
      return "siamese_hybrid_pre";
    case NormTopology::kSiamesePostPre:
      return "siamese_post_pre";
  }
  return "?";
}

bool is_siamese(NormTopology t) { return t == NormTopology::kSiameseHybridPre || t == NormTopology::kSiamesePostPre; }

NormTopology ModelConfig::topology() const {
  if (norm_topology) return *norm_topology;
  return variant == Variant::kSiameseDepth && use_siamese_norm ? NormTopology::kSiameseHybridPre
                                                               : NormTopology::kReordered;
}

double ModelConfig::deepnorm_alpha() const { return std::pow(2.0 * static_cast<double>(num_hidden_layers), 0.25); }
double ModelConfig::deepnorm_beta() const { return std::pow(8.0 * static_cast<double>(num_hidden_layers), -0.25); }

std::vector<LayerType> default_layer_types(int64_t num_layers) {
  std::vector<LayerType> types;
  for (int64_t l = 0; l < num_layers; ++l) {
    types.push_back((l + 1) % 4 == 0 ? LayerType::kFull : LayerType::kSliding);
  }
  return types;
}

namespace {

// Bounds far above any real model, so that a corrupt value is an error rather than hours of work or memory.
constexpr int64_t kMaxLayers = 4096, kMaxWidth = 1 << 20, kMaxVocab = 1 << 24, kMaxPositions = 1 << 24;

// Reads config.json fields with errors that name the file and the field.
class FieldReader {
 public:
  FieldReader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(source_ + ": field '" + field + "' " + what);
  }

  bool has(const std::string& field) const {
    asked_.insert(field);
    return j_.contains(field) && !j_.at(field).is_null();
  }

  // HF configs carry many keys the maths does not use, so unknown keys are fine; but one a typo away from a
  // key we read (sliding_windw) silently leaves that key at its default: say so.
  void warn_near_misses() const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (asked_.count(it.key()) || it.key().size() < 5) continue;
      for (const auto& known : asked_) {
        if (edit_distance(it.key(), known) <= 2) {
          std::fprintf(stderr, "warning: %s: unknown key '%s' (did you mean '%s'? it keeps its default)\n",
                       source_.c_str(), it.key().c_str(), known.c_str());
          break;
        }
      }
    }
  }

  int64_t integer(const std::string& field) const {
    if (!has(field)) fail(field, "is missing (required)");
    return as_integer(j_.at(field), field);
  }
  int64_t integer(const std::string& field, int64_t fallback) const {
    return has(field) ? as_integer(j_.at(field), field) : fallback;
  }
  double number(const std::string& field) const {
    if (!has(field)) fail(field, "is missing (required)");
    return as_number(j_.at(field), field);
  }
  double number(const std::string& field, double fallback) const {
    return has(field) ? as_number(j_.at(field), field) : fallback;
  }
  bool boolean(const std::string& field, bool fallback) const {
    if (!has(field)) return fallback;
    const json& v = j_.at(field);
    if (!v.is_boolean()) fail(field, "must be true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::optional<std::string> string(const std::string& field) const {
    if (!has(field)) return std::nullopt;
    const json& v = j_.at(field);
    if (!v.is_string()) fail(field, "must be a string, got " + v.dump());
    return v.get<std::string>();
  }
  std::optional<int64_t> optional_integer(const std::string& field) const {
    if (!has(field)) return std::nullopt;
    const json& v = j_.at(field);
    // Some configs carry a list of EOS ids; the first is the one generation stops on.
    if (v.is_array() && !v.empty()) return as_integer(v.at(0), field);
    return as_integer(v, field);
  }
  // A field that must hold one exact value if present (a feature the engine does not implement otherwise).
  template <typename T>
  void require_value(const std::string& field, const T& expected, const std::string& why) const {
    if (!has(field)) return;
    const json& v = j_.at(field);
    if (v != json(expected))
      fail(field, "is " + v.dump() + "; only " + json(expected).dump() + " is supported (" + why + ")");
  }

  const json& at(const std::string& field) const { return j_.at(field); }
  const std::string& source() const { return source_; }

 private:
  int64_t as_integer(const json& v, const std::string& field) const {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(field, "is too large: " + v.dump());
    if (v.is_number_integer() || v.is_number_unsigned()) return v.get<int64_t>();
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::floor(d) == d && std::abs(d) < 9007199254740992.0) return static_cast<int64_t>(d);  // exact below 2^53
    }
    fail(field, "must be an integer, got " + v.dump());
  }
  double as_number(const json& v, const std::string& field) const {
    if (!v.is_number()) fail(field, "must be a number, got " + v.dump());
    return v.get<double>();
  }

  const json& j_;
  std::string source_;
  mutable std::set<std::string> asked_;  // every key looked up, present or not
};

// Parses a rope dict: transformers 4.x `rope_scaling`, or 5.x `rope_parameters` (which also carries
// rope_theta). Returns nullopt for the plain ("default") type.
std::optional<YarnScaling> parse_rope_dict(const json& d, const std::string& source, const std::string& field) {
  if (!d.is_object()) throw Error(source + ": field '" + field + "' must be an object or null, got " + d.dump());
  FieldReader r(d, source);
  std::string type = r.string("rope_type").value_or(r.string("type").value_or("default"));
  auto sub = [&](const std::string& name) { return field + "." + name; };
  if (type == "default") return std::nullopt;
  if (type != "yarn") {
    throw Error(source + ": field '" + sub("rope_type") + "' is \"" + type +
                "\"; supported: \"default\" (plain RoPE) and \"yarn\"");
  }
  auto number = [&](const std::string& name, double fallback) {
    if (!r.has(name)) return fallback;
    if (!d.at(name).is_number())
      throw Error(source + ": field '" + sub(name) + "' must be a number, got " + d.at(name).dump());
    return d.at(name).get<double>();
  };
  YarnScaling y;
  if (!r.has("factor")) throw Error(source + ": field '" + sub("factor") + "' is missing (required for yarn)");
  y.factor = number("factor", 0);
  if (!r.has("original_max_position_embeddings")) {
    throw Error(source + ": field '" + sub("original_max_position_embeddings") + "' is missing (required for yarn)");
  }
  y.original_max_position_embeddings = static_cast<int64_t>(number("original_max_position_embeddings", 0));
  y.beta_fast = number("beta_fast", 32.0);
  y.beta_slow = number("beta_slow", 1.0);
  if (r.has("attention_factor")) y.attention_factor = number("attention_factor", 1.0);
  for (const char* unsupported : {"mscale", "mscale_all_dim"}) {
    if (r.has(unsupported))
      throw Error(source + ": field '" + sub(unsupported) + "' is not supported (OLMo 3 YaRN has none)");
  }
  if (r.has("truncate") && d.at("truncate") != json(true)) {
    throw Error(source + ": field '" + sub("truncate") + "' must be true (OLMo 3 YaRN rounds the correction range)");
  }
  if (!(y.factor > 1.0))
    throw Error(source + ": field '" + sub("factor") + "' must be > 1, got " + json(y.factor).dump());
  if (y.original_max_position_embeddings <= 0) {
    throw Error(source + ": field '" + sub("original_max_position_embeddings") + "' must be positive");
  }
  return y;
}

}  // namespace

ModelConfig ModelConfig::from_json(const json& j, const std::string& source) {
  if (!j.is_object()) throw Error(source + ": expected a JSON object at the top level");
  FieldReader r(j, source);
  ModelConfig c;

  std::string model_type = r.string("model_type").value_or("");
  if (model_type == "olmo3") {
    c.variant = Variant::kBase;
  } else if (model_type == "olmo3_siamese_depth") {
    c.variant = Variant::kSiameseDepth;
  } else if (model_type.empty()) {
    r.fail("model_type", "is missing (required: \"olmo3\" or \"olmo3_siamese_depth\")");
  } else {
    r.fail("model_type", "is \"" + model_type + "\"; supported: \"olmo3\" and \"olmo3_siamese_depth\"");
  }

  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_attention_heads = r.integer("num_attention_heads");
  c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads);
  if (r.has("head_dim")) {
    c.head_dim = r.integer("head_dim");
    c.head_dim_explicit = true;
  } else if (c.num_attention_heads > 0) {
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  // eps has a dangerous HF class default (1e-5, not OLMo 3's 1e-6), so it must be stated.
  c.rms_norm_eps = r.number("rms_norm_eps");
  c.max_position_embeddings = r.integer("max_position_embeddings", 65536);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);

  if (r.has("layer_types")) {
    const json& types = r.at("layer_types");
    if (!types.is_array()) r.fail("layer_types", "must be a list, got " + types.dump());
    for (size_t i = 0; i < types.size(); ++i) {
      const json& t = types[i];
      if (t == "sliding_attention") {
        c.layer_types.push_back(LayerType::kSliding);
      } else if (t == "full_attention") {
        c.layer_types.push_back(LayerType::kFull);
      } else {
        r.fail("layer_types[" + std::to_string(i) + "]",
               "is " + t.dump() + "; expected \"sliding_attention\" or \"full_attention\"");
      }
    }
  } else {
    if (c.num_hidden_layers > kMaxLayers)
      r.fail("num_hidden_layers",
             "is " + std::to_string(c.num_hidden_layers) + "; at most " + std::to_string(kMaxLayers));
    c.layer_types = default_layer_types(c.num_hidden_layers);
  }
  c.sliding_window = r.integer("sliding_window", 4096);

  // RoPE: transformers 4.x writes rope_theta + rope_scaling; 5.x writes rope_parameters.
  if (r.has("rope_parameters")) {
    const json& p = r.at("rope_parameters");
    if (!p.is_object()) r.fail("rope_parameters", "must be an object, got " + p.dump());
    if (p.contains("full_attention") || p.contains("sliding_attention")) {
      // Per-layer-type form: sliding layers must be plain (SPEC.md section 1).
      if (p.contains("sliding_attention") &&
          parse_rope_dict(p.at("sliding_attention"), source, "rope_parameters.sliding_attention")) {
        r.fail("rope_parameters.sliding_attention",
               "is yarn; sliding layers always use plain RoPE (SPEC.md section 1)");
      }
      const json& full = p.contains("full_attention") ? p.at("full_attention") : p.at("sliding_attention");
      c.rope_scaling = parse_rope_dict(full, source, "rope_parameters.full_attention");
      FieldReader fr(full, source);
      if (!fr.has("rope_theta")) r.fail("rope_parameters.full_attention.rope_theta", "is missing (required)");
      c.rope_theta = fr.number("rope_theta");
    } else {
      c.rope_scaling = parse_rope_dict(p, source, "rope_parameters");
      FieldReader pr(p, source);
      if (!pr.has("rope_theta") && !r.has("rope_theta")) r.fail("rope_parameters.rope_theta", "is missing (required)");
      c.rope_theta = pr.has("rope_theta") ? pr.number("rope_theta") : r.number("rope_theta");
    }
  } else {
    c.rope_theta = r.number("rope_theta");
    if (r.has("rope_scaling")) c.rope_scaling = parse_rope_dict(r.at("rope_scaling"), source, "rope_scaling");
  }

  c.eos_token_id = r.optional_integer("eos_token_id");
  c.pad_token_id = r.optional_integer("pad_token_id");
  c.bos_token_id = r.optional_integer("bos_token_id");
  c.padded_vocab_size = r.integer("padded_vocab_size", 0);
  c.vocab_z_loss_coeff = r.number("vocab_z_loss_coeff", 1e-5);
  c.truncated_normal_factor = r.number("truncated_normal_factor", 3.0);

  // Features the maths does not include: refuse rather than silently compute another model.
  r.require_value("hidden_act", std::string("silu"), "SwiGLU MLP");
  r.require_value("attention_bias", false, "OLMo 3 has no biases");
  r.require_value("mlp_bias", false, "OLMo 3 has no biases");
  r.require_value("qk_norm", true, "OLMo 3 normalises q and k");
  r.require_value("qk_norm_mode", std::string("full_projection"), "SPEC.md section 1");
  r.require_value("scale_embeds", false, "OLMo 3 does not scale embeddings");

  std::optional<std::string> topology_text = r.string("norm_topology");
  if (topology_text) c.norm_topology = parse_norm_topology(*topology_text, source + ": field 'norm_topology'");
  if (c.variant == Variant::kSiameseDepth) {
    // Without norm_topology, use_siamese_norm (and siamese_norm_variant) say which block it is; with it,
    // use_siamese_norm follows the topology unless stated (validate refuses a contradiction).
    const bool topology_siamese = c.norm_topology ? is_siamese(*c.norm_topology) : true;
    c.use_siamese_norm = r.boolean("use_siamese_norm", topology_siamese);
    c.use_depth_attention = r.boolean("use_depth_attention", true);
    c.depth_attention_stride = r.integer("depth_attention_stride", 8);
    c.depth_attention_recent_window = r.integer("depth_attention_recent_window", 0);
    if (std::optional<std::string> sv = r.string("siamese_norm_variant")) {
      if (*sv != "hybrid_pre" && *sv != "post_pre")
        r.fail("siamese_norm_variant", "is \"" + *sv + "\"; supported: \"hybrid_pre\" and \"post_pre\"");
      if (!c.norm_topology && c.use_siamese_norm && *sv == "post_pre") c.norm_topology = NormTopology::kSiamesePostPre;
      const NormTopology t = c.topology();
      if (is_siamese(t) && *sv != (t == NormTopology::kSiamesePostPre ? "post_pre" : "hybrid_pre")) {
        r.fail("siamese_norm_variant",
               "is \"" + *sv + "\" but norm_topology is \"" + norm_topology_name(t) + "\" (they must agree)");
      }
    }
    c.siamese_depth_scaling = r.boolean("siamese_depth_scaling", true);
    c.siamese_normalized_input = r.boolean("siamese_normalized_input", true);
  }

  c.validate(source);
  r.warn_near_misses();
  return c;
}

std::vector<std::string> ModelConfig::architecture_differences(const ModelConfig& other) const {
  std::vector<std::string> diffs;
  auto same = [&](const char* field, auto a, auto b) {
    if (a != b) diffs.push_back(std::string(field) + " " + std::to_string(a) + " -> " + std::to_string(b));
  };
  if (variant != other.variant)
    diffs.push_back(std::string("variant ") + variant_name(variant) + " -> " + variant_name(other.variant));
  same("hidden_size", hidden_size, other.hidden_size);
  same("num_hidden_layers", num_hidden_layers, other.num_hidden_layers);
  same("num_attention_heads", num_attention_heads, other.num_attention_heads);
  same("num_key_value_heads", num_key_value_heads, other.num_key_value_heads);
  same("head_dim", head_dim, other.head_dim);
  same("intermediate_size", intermediate_size, other.intermediate_size);
  same("vocab_size", vocab_size, other.vocab_size);
  if (variant == Variant::kSiameseDepth && other.variant == variant) {
    same("use_siamese_norm", int(use_siamese_norm), int(other.use_siamese_norm));
    same("use_depth_attention", int(use_depth_attention), int(other.use_depth_attention));
    same("depth_attention_stride", depth_attention_stride, other.depth_attention_stride);
    same("depth_attention_recent_window", depth_attention_recent_window, other.depth_attention_recent_window);
    if (topology() != other.topology()) {
      diffs.push_back(std::string("norm_topology ") + norm_topology_name(topology()) + " -> " +
                      norm_topology_name(other.topology()));
    }
    same("siamese_depth_scaling", int(siamese_depth_scaling), int(other.siamese_depth_scaling));
    same("siamese_normalized_input", int(siamese_normalized_input), int(other.siamese_normalized_input));
  }
  return diffs;
}

void ModelConfig::validate(const std::string& source) const {
  auto fail = [&](const std::string& field, const std::string& what) {
    throw Error(source + ": field '" + field + "' " + what);
  };
  auto positive = [&](const std::string& field, int64_t v) {
    if (v <= 0) fail(field, "must be positive, got " + std::to_string(v));
  };
  auto at_most = [&](const std::string& field, int64_t v, int64_t bound) {
    if (v > bound) fail(field, "is " + std::to_string(v) + "; at most " + std::to_string(bound) + " is plausible");
  };
  at_most("vocab_size", vocab_size, kMaxVocab);
  at_most("hidden_size", hidden_size, kMaxWidth);
  at_most("intermediate_size", intermediate_size, kMaxWidth);
  at_most("num_hidden_layers", num_hidden_layers, kMaxLayers);
  at_most("num_attention_heads", num_attention_heads, kMaxWidth);
  at_most("num_key_value_heads", num_key_value_heads, kMaxWidth);
  at_most("head_dim", head_dim, kMaxWidth);
  at_most("max_position_embeddings", max_position_embeddings, kMaxPositions);
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  if (num_attention_heads % num_key_value_heads != 0) {
    fail("num_key_value_heads", std::to_string(num_key_value_heads) + " does not divide num_attention_heads " +
                                    std::to_string(num_attention_heads));
  }
  if (!head_dim_explicit && hidden_size % num_attention_heads != 0) {
    fail("num_attention_heads", std::to_string(num_attention_heads) + " does not divide hidden_size " +
                                    std::to_string(hidden_size) + " (and head_dim is not set)");
  }
  positive("head_dim", head_dim);
  if (head_dim % 2 != 0) fail("head_dim", "must be even for rotary embeddings, got " + std::to_string(head_dim));
  if (static_cast<int64_t>(layer_types.size()) != num_hidden_layers) {
    fail("layer_types", "has " + std::to_string(layer_types.size()) + " entries but num_hidden_layers is " +
                            std::to_string(num_hidden_layers));
  }
  for (LayerType t : layer_types) {
    if (t == LayerType::kSliding) positive("sliding_window", sliding_window);
  }
  if (!(rope_theta > 1.0 && std::isfinite(rope_theta)))
    fail("rope_theta", "must be a finite number > 1, got " + nlohmann::json(rope_theta).dump());
  if (!(rms_norm_eps > 0.0 && rms_norm_eps <= 0.1))
    fail("rms_norm_eps", "must be in (0, 0.1], got " + nlohmann::json(rms_norm_eps).dump());
  if (rope_scaling) {
    const YarnScaling& y = *rope_scaling;
    const std::string field = "rope_scaling";
    if (!(y.factor > 1.0 && y.factor <= 1024))
      fail(field + ".factor", "must be in (1, 1024], got " + nlohmann::json(y.factor).dump());
    if (!(y.beta_slow > 0 && y.beta_fast > y.beta_slow && std::isfinite(y.beta_fast))) {
      fail(field + ".beta_fast", "must be finite and greater than beta_slow > 0, got beta_fast " +
                                     nlohmann::json(y.beta_fast).dump() + ", beta_slow " +
                                     nlohmann::json(y.beta_slow).dump());
    }
    if (y.attention_factor && !(*y.attention_factor > 0 && *y.attention_factor <= 10)) {
      fail(field + ".attention_factor", "must be in (0, 10], got " + nlohmann::json(*y.attention_factor).dump());
    }
    if (y.original_max_position_embeddings <= 0) {
      fail(field + ".original_max_position_embeddings",
           "must be positive, got " + std::to_string(y.original_max_position_embeddings));
    }
  }
  for (const auto& [field, id] : {std::pair<const char*, const std::optional<int64_t>&>{"eos_token_id", eos_token_id},
                                  {"pad_token_id", pad_token_id},
                                  {"bos_token_id", bos_token_id}}) {
    if (id && (*id < 0 || *id >= vocab_size))
      fail(field, "is " + std::to_string(*id) + ", outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  }
  positive("max_position_embeddings", max_position_embeddings);
  if (tie_word_embeddings) fail("tie_word_embeddings", "must be false (OLMo 3 has an untied output head)");
  if (padded_vocab_size != 0 && padded_vocab_size < vocab_size) {
    fail("padded_vocab_size",
         std::to_string(padded_vocab_size) + " is smaller than vocab_size " + std::to_string(vocab_size));
  }
  if (variant == Variant::kSiameseDepth) {
    positive("depth_attention_stride", depth_attention_stride);
    if (depth_attention_recent_window < 0) fail("depth_attention_recent_window", "must be >= 0");
  }
  const NormTopology t = topology();
  if (variant == Variant::kBase && t != NormTopology::kReordered) {
    fail("norm_topology", std::string("is \"") + norm_topology_name(t) +
                              "\"; model_type olmo3 (transformers' Olmo3) is always \"reordered\": other topologies "
                              "need the siamese_depth variant (model_type olmo3_siamese_depth, with "
                              "use_depth_attention false for the topology alone)");
  }
  if (variant == Variant::kSiameseDepth && norm_topology && is_siamese(*norm_topology) != use_siamese_norm) {
    fail("use_siamese_norm", std::string("is ") + (use_siamese_norm ? "true" : "false") + " but norm_topology \"" +
                                 norm_topology_name(*norm_topology) + "\" is " + (is_siamese(t) ? "" : "not ") +
                                 "a SiameseNorm topology (they must agree)");
  }
  if (!is_siamese(t)) {
    if (!siamese_depth_scaling) fail("siamese_depth_scaling", "applies to the siamese_* topologies only");
    if (!siamese_normalized_input) fail("siamese_normalized_input", "applies to the siamese_* topologies only");
  }
}

json ModelConfig::to_json() const {
  json j;
  j["model_type"] = model_type_name(variant);
  j["architectures"] = json::array({variant == Variant::kBase ? "Olmo3ForCausalLM" : "Olmo3SiameseDepthForCausalLM"});
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  if (head_dim_explicit) j["head_dim"] = head_dim;
  json types = json::array();
  for (LayerType t : layer_types) types.push_back(layer_type_name(t));
  j["layer_types"] = types;
  j["sliding_window"] = sliding_window;
  j["rope_theta"] = rope_theta;
  if (rope_scaling) {
    json y = {{"rope_type", "yarn"},
              {"factor", rope_scaling->factor},
              {"original_max_position_embeddings", rope_scaling->original_max_position_embeddings},
              {"beta_fast", rope_scaling->beta_fast},
              {"beta_slow", rope_scaling->beta_slow}};
    if (rope_scaling->attention_factor) y["attention_factor"] = *rope_scaling->attention_factor;
    j["rope_scaling"] = y;
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["max_position_embeddings"] = max_position_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["eos_token_id"] = eos_token_id ? json(*eos_token_id) : json(nullptr);
  j["pad_token_id"] = pad_token_id ? json(*pad_token_id) : json(nullptr);
  j["bos_token_id"] = bos_token_id ? json(*bos_token_id) : json(nullptr);
  if (padded_vocab_size) j["padded_vocab_size"] = padded_vocab_size;
  j["vocab_z_loss_coeff"] = vocab_z_loss_coeff;
  j["truncated_normal_factor"] = truncated_normal_factor;
  if (variant == Variant::kSiameseDepth) {
    j["use_siamese_norm"] = use_siamese_norm;
    j["use_depth_attention"] = use_depth_attention;
    j["siamese_norm_variant"] = topology() == NormTopology::kSiamesePostPre ? "post_pre" : "hybrid_pre";
    // Written only when set or not the default, so configs without them stay as they were.
    if (norm_topology) j["norm_topology"] = norm_topology_name(*norm_topology);
    if (!siamese_depth_scaling) j["siamese_depth_scaling"] = false;
    if (!siamese_normalized_input) j["siamese_normalized_input"] = false;
    j["depth_attention_stride"] = depth_attention_stride;
    j["depth_attention_recent_window"] = depth_attention_recent_window;
    j["qk_norm"] = true;
    j["qk_norm_mode"] = "full_projection";
    j["true_vocab_size"] = vocab_size;
    // Where transformers finds the classes (archs/olmo3-siamese-depth-attn, copied beside the weights).
    j["auto_map"] = {{"AutoConfig", "configuration_olmo3_siamese_depth.Olmo3SiameseDepthConfig"},
                     {"AutoModel", "modeling_olmo3_siamese_depth.Olmo3SiameseDepthModel"},
                     {"AutoModelForCausalLM", "modeling_olmo3_siamese_depth.Olmo3SiameseDepthForCausalLM"}};
  }
  return j;
}

ModelConfig ModelConfig::load(const std::string& path) { return from_json(read_json_file(path), path); }

void ModelConfig::save(const std::string& path) const { write_file(path, to_json().dump(2) + "\n"); }

void VariantSwitches::apply_to(ModelConfig& c, const std::string& where) const {
  if (!any()) return;
  if (c.variant != Variant::kSiameseDepth && norm_topology && *norm_topology != NormTopology::kReordered) {
    throw Error(where + ": norm_topology \"" + norm_topology_name(*norm_topology) +
                "\" needs the siamese_depth variant (base is transformers' Olmo3, always \"reordered\"; set the "
                "variant to siamese_depth, with use_depth_attention false for the topology alone)");
  }
  VariantSwitches others = *this;
  others.norm_topology.reset();
  if (c.variant == Variant::kBase && !others.any()) return;  // "reordered" on base: its own topology
  if (c.variant != Variant::kSiameseDepth) {
    throw Error(where + ": the SiameseNorm/Depth-Attention switches need the siamese_depth variant (the model is " +
                variant_name(c.variant) + ")");
  }
  if (norm_topology) {
    c.norm_topology = *norm_topology;
    c.use_siamese_norm = use_siamese_norm.value_or(is_siamese(*norm_topology));  // a contradiction fails validate
  } else if (use_siamese_norm) {
    c.use_siamese_norm = *use_siamese_norm;
    // SiameseNorm switched off (or on) over a config naming a topology of the other kind: the switch wins.
    if (c.norm_topology && is_siamese(*c.norm_topology) != *use_siamese_norm) c.norm_topology.reset();
  }
  if (siamese_depth_scaling) c.siamese_depth_scaling = *siamese_depth_scaling;
  if (siamese_normalized_input) c.siamese_normalized_input = *siamese_normalized_input;
  if (use_depth_attention) c.use_depth_attention = *use_depth_attention;
  if (depth_attention_stride) c.depth_attention_stride = *depth_attention_stride;
  if (depth_attention_recent_window) c.depth_attention_recent_window = *depth_attention_recent_window;
}

}  // namespace archspace
