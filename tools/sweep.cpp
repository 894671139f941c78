// archspace sweep: one run config over a grid of overrides, matched data and seed, one summary (docs/training.md,
// "Sweeps"). The grid, the resumption rules and the summary are the library's (train/sweep.h); this prints the
// table and draws the curves with the project's plot script.
#include "archspace/train/sweep.h"

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "archspace/util/error.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct SweepArgs {
  std::string config;
  std::vector<std::string> grid, overrides;
  bool no_plot = false;
  SweepOptions options;
};

std::string fixed(double v, int digits = 4) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

void print_table(const SweepResult& r) {
  size_t width = 4;
  for (const auto& s : r.runs) width = std::max(width, s.name.size());
  std::printf("%-*s  %-11s %6s %9s %9s %9s %9s %7s  %s\n", static_cast<int>(width), "run", "status", "steps", "first",
              "final", "min", "valid", "spikes", "diverged");
  for (const auto& s : r.runs) {
    std::printf("%-*s  %-11s %6lld %9s %9s %9s %9s %7zu  %s\n", static_cast<int>(width), s.name.c_str(),
                s.status.c_str(), static_cast<long long>(s.steps), s.steps ? fixed(s.first_loss).c_str() : "-",
                s.steps ? fixed(s.final_loss).c_str() : "-", s.steps ? fixed(s.min_loss).c_str() : "-",
                s.final_valid_loss >= 0 ? fixed(s.final_valid_loss).c_str() : "-", s.spike_steps.size(),
                s.diverged ? "yes" : "no");
  }
}

// The runs' loss curves on one chart, by the script `archspace plot` uses.
void plot(const SweepResult& r) {
  namespace fs = std::filesystem;
  std::vector<std::string> args = {"--out", (fs::path(r.out_dir) / "sweep.png").string()};
  for (const auto& s : r.runs) {
    if (fs::exists(fs::path(s.run_dir) / "metrics.jsonl")) args.push_back(s.run_dir);
  }
  if (args.size() > 2) plot_or_warn(ARCHSPACE_PLOT_SCRIPT, args, "the sweep's plot");
}

int run(SweepArgs& a) {
  a.options.config = a.config;
  a.options.overrides = a.overrides;
  for (const auto& g : a.grid) a.options.axes.push_back(parse_sweep_axis(g));
  const SweepResult r = run_sweep(a.options, [](size_t i, size_t n, const SweepRunSummary& s) {
    std::cerr << "[sweep] " << i + 1 << "/" << n << " " << s.name << ": " << s.status
              << (s.steps ? " (final loss " + fixed(s.final_loss) + ")" : "") << "\n";
  });
  print_table(r);
  if (!a.options.dry_run) {
    std::cout << "summary: " << (std::filesystem::path(r.out_dir) / "sweep.json").string() << "\n";
    if (!a.no_plot) plot(r);
  }
  return r.stopped_by_signal ? 128 + r.stopped_by_signal : 0;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<SweepArgs>();
  auto* app = parent.add_subcommand("sweep", "Train one run config over a grid of overrides, matched data and seed");
  app->add_option("--config", a->config, "the run's TOML")->required();
  app->add_option("--grid", a->grid, "an axis: section.key=V1,V2,... (repeatable; the first varies slowest)")
      ->required();
  app->add_option("--set", a->overrides, "override a key for every point: section.key=value (repeatable)");
  app->add_option("--out", a->options.out_dir, "the sweep directory (default: the config's train.run_dir)");
  app->add_flag("--retry-diverged", a->options.retry_diverged, "train diverged points again (default: keep them)");
  app->add_flag("--dry-run", a->options.dry_run,
                "check every point's configuration and list the points; train nothing");
  app->add_flag("--no-plot", a->no_plot, "do not draw OUT/sweep.png");
  app->add_option("--spike-window", a->options.spikes.window, "loss spikes: steps of the running median")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--spike-ratio", a->options.spikes.ratio, "loss spikes: a loss above this times the median")
      ->check(CLI::Range(1.0, 100.0))
      ->capture_default_str();
  return {app, [a] { return run(*a); }};
}

}  // namespace
ARCHSPACE_COMMAND(62, add);
}  // namespace archspace::cli
