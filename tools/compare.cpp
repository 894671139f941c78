// archspace compare: a matched comparison of two sides (one run or several seeds each): matched or not,
// convergence, and the paired per-task evaluation differences with their intervals (eval/compare.h holds the
// policy; this gathers flags, writes DIR/compare.json and compare.md, and draws the charts with matplotlib).
#include "archspace/eval/compare.h"

#include <filesystem>
#include <iostream>

#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "command.h"

namespace archspace::cli {
namespace {

namespace fs = std::filesystem;

struct CompareArgs {
  std::vector<std::string> positional, a, b, eval_a, eval_b;
  std::string out, suite;
  bool intersect = false, no_plot = false;
  int64_t resamples = 10000;
  uint64_t seed = 0;
  double smooth = 0.6;
  std::vector<double> levels;
};

int run(CompareArgs& args) {
  CompareOptions o;
  o.a = args.a;
  o.b = args.b;
  if (!args.positional.empty()) {
    if (args.positional.size() != 2 || !args.a.empty() || !args.b.empty())
      throw Error("compare: give two run directories (A B) or --a RUN... --b RUN..., not both");
    o.a = {args.positional[0]};
    o.b = {args.positional[1]};
  }
  if (o.a.empty() || o.b.empty()) throw Error("compare: give two run directories (A B) or --a RUN... --b RUN...");
  o.eval_a = args.eval_a;
  o.eval_b = args.eval_b;
  o.intersect = args.intersect;
  o.resamples = args.resamples;
  o.seed = args.seed;
  o.smooth = args.smooth;
  o.levels = args.levels;
  o.suite = args.suite;
  const nlohmann::json report = compare_runs(o);
  const std::string md = compare_markdown(report);
  std::cout << md << std::flush;
  if (args.out.empty()) return 0;
  fs::create_directories(args.out);
  const std::string json_path = (fs::path(args.out) / "compare.json").string();
  write_text_file_atomically(json_path, report.dump(2) + "\n");
  write_text_file_atomically((fs::path(args.out) / "compare.md").string(), md);
  std::cout << "wrote " << json_path << " and compare.md\n";
  if (!args.no_plot) plot_or_warn(ARCHSPACE_COMPARE_PLOT_SCRIPT, {json_path, "--out", args.out}, "the compare charts");
  return 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<CompareArgs>();
  auto* app = parent.add_subcommand(
      "compare", "Compare two runs or seed sets: matched or not, convergence, paired evaluation differences");
  app->add_option("RUN_DIR", a->positional, "A B: the two run directories");
  app->add_option("--a", a->a, "side A's run directories (several seeds)")->expected(1, -1);
  app->add_option("--b", a->b, "side B's run directories (several seeds)")->expected(1, -1);
  app->add_option("--eval-a", a->eval_a,
                  "side A's `eval downstream --requests-out` files, one per run (default: RUN/requests.jsonl when "
                  "every run has one)")
      ->expected(1, -1);
  app->add_option("--eval-b", a->eval_b, "side B's requests-out files, one per run")->expected(1, -1);
  app->add_flag("--intersect", a->intersect,
                "drop (and count) instances that only one side has or whose gold differs, instead of an error");
  app->add_option("--resamples", a->resamples, "bootstrap resamples")
      ->check(CLI::Range(int64_t{100}, int64_t{10000000}))
      ->capture_default_str();
  app->add_option("--seed", a->seed, "the bootstrap's seed (SplitMix64)")->capture_default_str();
  app->add_option("--smooth", a->smooth,
                  "smooth the training loss as `plot --smooth` does before finding the tokens to reach each level")
      ->check(CLI::Range(0.0, 0.999))
      ->capture_default_str();
  app->add_option("--levels", a->levels, "loss levels for tokens-to-reach (default: five chosen from the curves)")
      ->expected(1, -1);
  app->add_option("--suite", a->suite,
                  "also the table of an evaluation suite (olmo3-sft): each of its tasks' paired difference, a "
                  "group's at the suite's aggregate, and their macro");
  app->add_option("--out", a->out, "output directory: compare.json, compare.md, convergence.png, forest.png");
  app->add_flag("--no-plot", a->no_plot, "do not draw the PNG charts");
  return {app, [a] { return run(*a); }, /*computes=*/false};
}

}  // namespace
ARCHSPACE_COMMAND(85, add);
}  // namespace archspace::cli
