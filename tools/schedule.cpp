// archspace schedule: what a run config's recipe decides (optim.recipe: the schedule's convention, the decay groups,
// step skipping) and the learning rate of every step, before training, to check or plot (docs/training.md,
// "Recipes"). The schedule is the library's (archspace/train/lr_schedule.h), the one the trainer uses.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "archspace/config/train_config.h"
#include "archspace/train/lr_schedule.h"
#include "archspace/train/sweep.h"
#include "archspace/util/error.h"
#include "command.h"

namespace archspace::cli {
namespace {

struct ScheduleArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::vector<std::string> grid;  // section.key=V1,V2,...: one schedule per point
  bool json = false;
};

// What the recipe decided and the lr of every step (1-based in the table, a list in JSON).
nlohmann::json describe(const TrainConfig& c) {
  const LrSchedule s = LrSchedule::of(c);
  nlohmann::json lr = nlohmann::json::array();
  for (int64_t step = 0; step < c.max_steps; ++step) lr.push_back(s.at(step));
  nlohmann::json out = {{"recipe", recipe_name(c.recipe)},
                        {"schedule", schedule_shape_name(c.schedule)},
                        {"schedule_convention", convention_name(c.schedule_convention)},
                        {"warmup_steps", c.warmup_steps},
                        {"max_steps", c.max_steps},
                        {"final_lr_factor", c.final_lr_factor},
                        {"decay_norms", c.decay_norms},
                        {"decay_embeddings", c.decay_embeddings},
                        {"skip_steps", c.skip_steps},
                        {"data_order", data_order_name(c.data_order)},
                        {"lr", lr}};
  if (c.schedule == ScheduleShape::kWsd) {
    out["decay_steps"] = s.decay_steps;
    out["wsd_decay_shape"] = wsd_decay_shape_name(c.wsd_decay_shape);
  }
  return out;
}

void print_table(const TrainConfig& c, const nlohmann::json& d) {
  std::printf("recipe %s: %s schedule as %s computes it, warm-up %lld of %lld steps, final factor %g\n",
              recipe_name(c.recipe), schedule_shape_name(c.schedule), convention_name(c.schedule_convention),
              static_cast<long long>(c.warmup_steps), static_cast<long long>(c.max_steps), c.final_lr_factor);
  std::printf("weight decay %g on linear layers%s%s; step skipping %s; data order %s\n", c.weight_decay,
              c.decay_norms ? ", norms" : "", c.decay_embeddings ? ", embeddings" : "",
              c.skip_steps ? "on (OLMo-core's SkipStepAdamW rule)" : "off", data_order_name(c.data_order));
  for (size_t step = 0; step < d["lr"].size(); ++step)
    std::printf("%zu\t%.17g\n", step + 1, d["lr"][step].get<double>());
}

// Without --grid: the config's schedule. With it: one per point (a JSON line each with --json); a point whose
// settings are invalid prints its error (as "error" in JSON) and the command exits 1 after the others.
int run(const ScheduleArgs& a) {
  if (a.grid.empty()) {
    const TrainConfig c = TrainConfig::load(a.config, a.overrides);
    const nlohmann::json d = describe(c);
    if (a.json)
      std::cout << d.dump() << "\n";
    else
      print_table(c, d);
    return 0;
  }
  std::vector<SweepAxis> axes;
  for (const auto& g : a.grid) axes.push_back(parse_sweep_axis(g));
  int status = 0;
  for (const SweepPoint& point : expand_sweep_grid(axes)) {
    std::vector<std::string> overrides = a.overrides;
    for (const auto& [key, value] : point.settings) overrides.push_back(key + "=" + value);
    try {
      const TrainConfig c = TrainConfig::load(a.config, overrides);
      nlohmann::json d = describe(c);
      d["point"] = point.name;
      if (a.json) {
        std::cout << d.dump() << "\n";
      } else {
        std::printf("== %s\n", point.name.c_str());
        print_table(c, d);
      }
    } catch (const Error& e) {
      status = 1;
      if (a.json)
        std::cout << nlohmann::json{{"point", point.name}, {"error", e.what()}}.dump() << "\n";
      else
        std::printf("== %s\nerror: %s\n", point.name.c_str(), e.what());
    }
  }
  return status;
}

Command add(CLI::App& parent) {
  auto a = std::make_shared<ScheduleArgs>();
  auto* app = parent.add_subcommand(
      "schedule", "Print a run config's recipe and the learning rate of each step (1-based), as train would use them");
  app->add_option("--config", a->config, "the run's TOML (see docs/training.md, Training configuration)")->required();
  app->add_option("--set", a->overrides,
                  "override a key of the TOML: section.key=value (repeatable; type-checked, unknown keys refused)");
  app->add_option("--grid", a->grid,
                  "section.key=V1,V2,...: a schedule per point of the grid of these axes (repeatable), as sweep "
                  "expands it");
  app->add_flag("--json", a->json,
                "one JSON object (a line per grid point): the recipe's settings and \"lr\", one entry per step");
  return {app, [a] { return run(*a); }, /*computes=*/false};
}

}  // namespace
ARCHSPACE_COMMAND(61, add);
}  // namespace archspace::cli
