// archspace plot: loss curves of several runs on one chart. Plotting is matplotlib's job: this hands
// the arguments to the project's script (scripts/plot_runs.py) with the python that has matplotlib.
#include "command.h"

namespace archspace::cli {
namespace {

struct PlotArgs {
  std::vector<std::string> runs;
  std::string out, x = "step";
  double smooth = 0;
};

int run(const PlotArgs& a) {
  std::vector<std::string> args = {"--out", a.out, "--x", a.x, "--smooth", std::to_string(a.smooth)};
  args.insert(args.end(), a.runs.begin(), a.runs.end());
  return run_python_script(ARCHSPACE_PLOT_SCRIPT, args);  // the script names a bad run directory itself
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<PlotArgs>();
  auto* app = parent.add_subcommand("plot", "Draw the loss curves of several runs on one chart (PNG)");
  app->add_option("RUN_DIR", a->runs, "run directories (each with metrics.jsonl)")->required();
  app->add_option("--out", a->out, "output image, e.g. losses.png")->required();
  app->add_option("--x", a->x, "x axis")->check(CLI::IsMember({"step", "tokens"}))->capture_default_str();
  app->add_option("--smooth", a->smooth,
                  "smooth the training loss as TensorBoard does: exponential moving average with this weight on "
                  "the past, debiased (0: off, 0.9: strong); the raw curve stays behind it, faint")
      ->check(CLI::Range(0.0, 0.999))
      ->capture_default_str();
  return {app, [a] { return run(*a); }, /*computes=*/false};
}

}  // namespace
ARCHSPACE_COMMAND(80, add);
}  // namespace archspace::cli
