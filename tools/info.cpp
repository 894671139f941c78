// archspace info: what a model directory, a config.json or a preset describes.
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include "archspace/io/safetensors.h"
#include "archspace/model/causal_lm.h"
#include "archspace/model/model_io.h"
#include "archspace/model/rope.h"
#include "archspace/util/error.h"
#include "command.h"

namespace archspace::cli {
namespace {

std::string describe_rope(const ModelConfig& c, LayerType type) {
  std::ostringstream s;
  if (type == LayerType::kFull && c.rope_scaling) {
    YarnFrequencies y = yarn_inv_freq(c.head_dim, c.rope_theta, *c.rope_scaling);
    s << "yarn (theta " << c.rope_theta << ", factor " << c.rope_scaling->factor << ", original length "
      << c.rope_scaling->original_max_position_embeddings << ", beta_fast " << c.rope_scaling->beta_fast
      << ", beta_slow " << c.rope_scaling->beta_slow << ", ramp dims " << y.low << ".." << y.high
      << ", attention factor " << y.attention_factor << ")";
  } else {
    s << "plain (theta " << c.rope_theta << ")";
  }
  return s.str();
}

// Layer types as a compact pattern: "[S, S, S, F] x 4" when it repeats, else the full list.
std::string describe_layer_types(const std::vector<LayerType>& types) {
  auto letter = [](LayerType t) { return t == LayerType::kSliding ? "S" : "F"; };
  for (size_t period = 1; period <= types.size(); ++period) {
    if (types.size() % period) continue;
    bool repeats = true;
    for (size_t i = period; i < types.size() && repeats; ++i) repeats = types[i] == types[i % period];
    if (!repeats) continue;
    std::string s = "[";
    for (size_t i = 0; i < period; ++i) s += std::string(i ? ", " : "") + letter(types[i]);
    s += "]";
    if (types.size() / period > 1) s += " x " + std::to_string(types.size() / period);
    return s;
  }
  return "[]";
}

void print_config(const ModelConfig& c, const std::string& weights_dtype) {
  std::cout << "variant:            " << variant_name(c.variant) << " (model_type " << model_type_name(c.variant)
            << ")\n";
  std::cout << "norm topology:      " << norm_topology_name(c.topology());
  if (c.topology() == NormTopology::kDeepNorm)
    std::cout << " (alpha " << c.deepnorm_alpha() << ", init beta " << c.deepnorm_beta() << ")";
  if (is_siamese(c.topology())) {
    std::cout << " (depth-wise scaling " << (c.siamese_depth_scaling ? "on" : "off") << ", normalized input "
              << (c.siamese_normalized_input ? "on" : "off") << ")";
  }
  std::cout << "\n";
  if (c.variant == Variant::kSiameseDepth) {
    const bool siamese = is_siamese(c.topology());
    const char* which = c.topology() == NormTopology::kSiamesePostPre ? "on (post_pre)" : "on (hybrid_pre)";
    std::cout << "  siamese norm:     " << (siamese ? which : "off") << "\n"
              << "  depth attention:  "
              << (c.use_depth_attention ? "on (stride " + std::to_string(c.depth_attention_stride) +
                                              ", recent window " + std::to_string(c.depth_attention_recent_window) + ")"
                                        : std::string("off"))
              << "\n";
  }
  std::cout << "layers:             " << c.num_hidden_layers << "\n"
            << "hidden size:        " << c.hidden_size << "\n"
            << "MLP size:           " << c.intermediate_size << "\n"
            << "heads:              " << c.num_attention_heads << " query, " << c.num_key_value_heads << " kv ("
            << (c.num_key_value_heads == c.num_attention_heads ? "MHA"
                                                               : "GQA, " + std::to_string(c.kv_groups()) + " per group")
            << "), head_dim " << c.head_dim << "\n"
            << "vocabulary:         " << c.vocab_size;
  if (c.padded_vocab_size && c.padded_vocab_size != c.vocab_size)
    std::cout << " (padded to " << c.padded_vocab_size << " in training)";
  std::cout << "\nlayer types:        " << describe_layer_types(c.layer_types) << "  (S = sliding window "
            << c.sliding_window << ", F = full)\n"
            << "RoPE, sliding:      " << describe_rope(c, LayerType::kSliding) << "\n"
            << "RoPE, full:         " << describe_rope(c, LayerType::kFull) << "\n"
            << "max positions:      " << c.max_position_embeddings << "\n"
            << "rms_norm_eps:       " << c.rms_norm_eps << "\n"
            << "parameters:         " << parameter_count(c) << " (" << human_count(parameter_count(c)) << ")\n"
            << "dtype:              " << weights_dtype << "\n";
}

// The weights' dtypes as "F32 (12 tensors)", after checking them against the config.
std::string describe_weights(const ModelConfig& config, const std::string& dir) {
  try {
    TensorStore store = TensorStore::open_dir(dir);
    check_weights(config, store, dir);
    std::map<std::string, int64_t> counts;
    for (const auto& name : store.names()) counts[store.info(name).dtype]++;
    std::string s;
    for (const auto& [name, n] : counts) s += (s.empty() ? "" : ", ") + name + " (" + std::to_string(n) + " tensors)";
    return s;
  } catch (const Error& e) {
    // A config without weights is still worth describing; broken weights are an error.
    if (std::string(e.what()).find("no model weights") == std::string::npos) throw;
    return "(no weights found)";
  }
}

struct InfoArgs {
  std::string path, preset, variant = "base", norm_topology;
};

int run(const InfoArgs& a) {
  namespace fs = std::filesystem;
  if (a.path.empty() == a.preset.empty()) throw Error("info: give a MODEL_DIR (or a config.json) or --preset NAME");
  if (!a.preset.empty()) {
    ModelConfig c = preset(a.preset, parse_variant(a.variant, "--variant"));
    VariantSwitches switches;
    if (!a.norm_topology.empty()) switches.norm_topology = parse_norm_topology(a.norm_topology, "--norm-topology");
    switches.apply_to(c, "info");
    c.validate("info");
    print_config(c, "(preset: no weights)");
  } else if (fs::is_regular_file(a.path)) {
    print_config(ModelConfig::load(a.path), "(a config file: no weights)");
  } else {
    const ModelConfig config = load_model_config(a.path);
    print_config(config, describe_weights(config, a.path));
  }
  return 0;
}

Command add(CLI::App& parent) {
  auto args = std::make_shared<InfoArgs>();
  auto* app = parent.add_subcommand(
      "info", "Describe a model directory, a config.json or a preset: variant, sizes, RoPE, parameters");
  auto* path = app->add_option("MODEL_DIR", args->path,
                               "Hugging Face model directory (config.json + safetensors), or a config.json");
  auto* model = app->add_option("--model", args->path, "the same as MODEL_DIR")->excludes(path);
  app->add_option("--preset", args->preset, "describe a built-in preset instead")->excludes(path)->excludes(model);
  app->add_option("--variant", args->variant, "with --preset: the variant")
      ->check(CLI::IsMember(variant_choices()))
      ->capture_default_str();
  app->add_option(
      "--norm-topology", args->norm_topology,
      "with --preset: the normalization topology (SPEC.md section 7): " + listed_choices(norm_topology_choices()));
  return {app, [args] { return run(*args); }, /*computes=*/false};
}

}  // namespace
ARCHSPACE_COMMAND(10, add);
}  // namespace archspace::cli
