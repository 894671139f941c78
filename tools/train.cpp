// archspace train: one pipeline stage from a TOML run config (docs/training.md).
#include <iostream>

#include "archspace/config/train_config.h"
#include "archspace/train/trainer.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;  // section.key=value
  TrainOptions options;
};

int run(const TrainArgs& a) {
  const TrainResult r = run_training(TrainConfig::load(a.config, a.overrides), a.options);
  if (speaks_for_run()) std::cerr << "checkpoint: " << r.final_checkpoint << "\n";  // rank 0 speaks for the run
  return r.stopped_by_signal ? 128 + r.stopped_by_signal : 0;  // the shell's convention for a signalled stop
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<TrainArgs>();
  auto* app = parent.add_subcommand("train", "Train one pipeline stage from a TOML run config");
  app->add_option("--config", a->config, "the run's TOML (see docs/training.md, Training configuration)")->required();
  app->add_option("--set", a->overrides,
                  "override a key of the TOML: section.key=value (repeatable; type-checked, unknown keys refused)");
  app->add_flag("--resume", a->options.resume, "continue from the run's latest checkpoint");
  app->add_option("--resume-from", a->options.resume_from,
                  "continue from this checkpoint: step-N (or N) of the run, or a checkpoint directory");
  app->add_option("--stop-after", a->options.stop_after_step, "stop after this step as if interrupted (for tests)");
  return {app, [a] { return run(*a); }};
}

}  // namespace
ARCHSPACE_COMMAND(60, add);
}  // namespace archspace::cli
