// archspace init: a randomly initialised model directory (SPEC.md init) from a preset or a config.json.
#include "archspace/model/init.h"

#include <iostream>

#include "archspace/model/model_io.h"
#include "archspace/util/error.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct InitArgs {
  std::string preset, config, out, variant = "base", dtype = "fp32", init = "olmo-core";
  uint64_t seed = 0;
  bool no_siamese_norm = false, no_depth_attention = false;
  std::optional<int64_t> depth_stride, depth_recent_window;
  std::string norm_topology;
  bool no_siamese_depth_scaling = false, no_siamese_normalized_input = false;
};

int run(const InitArgs& a) {
  if (a.preset.empty() == a.config.empty()) throw Error("init: give --preset NAME or --config FILE");
  ModelConfig config =
      !a.config.empty() ? ModelConfig::load(a.config) : preset(a.preset, parse_variant(a.variant, "--variant"));
  VariantSwitches switches;
  if (a.no_siamese_norm) switches.use_siamese_norm = false;
  if (a.no_depth_attention) switches.use_depth_attention = false;
  switches.depth_attention_stride = a.depth_stride;
  switches.depth_attention_recent_window = a.depth_recent_window;
  if (!a.norm_topology.empty()) switches.norm_topology = parse_norm_topology(a.norm_topology, "--norm-topology");
  if (a.no_siamese_depth_scaling) switches.siamese_depth_scaling = false;
  if (a.no_siamese_normalized_input) switches.siamese_normalized_input = false;
  switches.apply_to(config, "init");
  config.validate("init");
  CausalLM model = initialised_model(config, a.seed, parse_init_scheme(a.init, "--init"));
  save_model(model, a.out, scalar_type(parse_dtype(a.dtype, "--dtype")));
  std::cerr << "wrote a randomly initialised " << variant_name(config.variant) << " model (norm topology "
            << norm_topology_name(config.topology()) << ", " << human_count(parameter_count(config)) << " parameters, "
            << a.init << " init, seed " << a.seed << ") to " << a.out << "\n";
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<InitArgs>();
  auto* app = parent.add_subcommand(
      "init", "Write a randomly initialised model directory (SPEC.md init) from a preset or a config.json");
  auto* preset_opt = app->add_option("--preset", a->preset, "preset name")->check(CLI::IsMember(preset_names()));
  app->add_option("--config", a->config, "or a config.json to instantiate")->excludes(preset_opt);
  app->add_option("--out", a->out, "output model directory")->required();
  app->add_option("--variant", a->variant, "model variant (with --preset)")
      ->check(CLI::IsMember(variant_choices()))
      ->capture_default_str();
  app->add_option("--seed", a->seed, "random seed")->capture_default_str();
  app->add_option("--init", a->init,
                  "how the weights are drawn: olmo-core (truncated normal 0.02 at +-3 std, SPEC.md's) or megatron "
                  "(normal 0.02, output projections at 0.02 / sqrt(2 x layers)); docs/training.md, \"Init\"")
      ->check(CLI::IsMember(init_scheme_choices()))
      ->capture_default_str();
  add_dtype_option(app, a->dtype, "dtype of the saved weights");
  app->add_flag("--no-siamese-norm", a->no_siamese_norm, "siamese_depth ablation: SiameseNorm off");
  app->add_flag("--no-depth-attention", a->no_depth_attention, "siamese_depth ablation: Depth-Attention off");
  app->add_option("--depth-stride", a->depth_stride, "siamese_depth: depth_attention_stride (default 8)")
      ->check(CLI::PositiveNumber);
  app->add_option("--depth-recent-window", a->depth_recent_window,
                  "siamese_depth: depth_attention_recent_window (default 0)")
      ->check(CLI::NonNegativeNumber);
  // Checked by parse_norm_topology, whose error lists the valid names.
  app->add_option("--norm-topology", a->norm_topology,
                  "normalization topology (SPEC.md section 7; other than reordered needs --variant siamese_depth): " +
                      listed_choices(norm_topology_choices()));
  app->add_flag("--no-siamese-depth-scaling", a->no_siamese_depth_scaling,
                "SiameseNorm ablation: c_l = 1 instead of 1/sqrt(2(l+1))");
  app->add_flag("--no-siamese-normalized-input", a->no_siamese_normalized_input,
                "SiameseNorm ablation: no norm on the fused sublayer input");
  return {app, [a] { return run(*a); }};
}

}  // namespace
ARCHSPACE_COMMAND(30, add);
}  // namespace archspace::cli
