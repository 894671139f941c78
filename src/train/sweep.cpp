#include "archspace/train/sweep.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "archspace/config/train_config.h"
#include "archspace/io/run_dir.h"
#include "archspace/train/stability.h"
#include "archspace/train/trainer.h"
#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/json_file.h"
#include "archspace/util/json_lines.h"

namespace archspace {
namespace fs = std::filesystem;
using nlohmann::json;

SweepAxis parse_sweep_axis(const std::string& text) {
  const std::string where = "--grid '" + text + "'";
  const size_t eq = text.find('=');
  const std::string key = text.substr(0, eq);
  const size_t dot = key.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == key.size()) {
    throw Error(where + ": expected section.key=V1,V2,... (e.g. optim.lr=1e-3,3e-3)");
  }
  SweepAxis axis{key, {}};
  const std::string values = text.substr(eq + 1);
  size_t start = 0;
  while (true) {
    const size_t comma = values.find(',', start);
    const std::string v = values.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (v.empty()) throw Error(where + ": an empty value in the list");
    if (std::find(axis.values.begin(), axis.values.end(), v) != axis.values.end()) {
      throw Error(where + ": value '" + v + "' appears twice");
    }
    axis.values.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return axis;
}

namespace {

// Characters a run directory's name keeps as they are; others become '_'.
std::string directory_safe(const std::string& s) {
  std::string out;
  for (char c : s)
    out += std::isalnum(static_cast<unsigned char>(c)) || std::string("._+-=").find(c) != std::string::npos ? c : '_';
  return out;
}

// The short name of each axis key in run names: its last component, or the whole key where two axes share one.
std::vector<std::string> short_names(const std::vector<SweepAxis>& axes) {
  std::vector<std::string> last, names;
  for (const auto& a : axes) last.push_back(a.key.substr(a.key.find('.') + 1));
  for (size_t i = 0; i < axes.size(); ++i) {
    names.push_back(std::count(last.begin(), last.end(), last[i]) > 1 ? axes[i].key : last[i]);
  }
  return names;
}

}  // namespace

std::vector<SweepPoint> expand_sweep_grid(const std::vector<SweepAxis>& axes) {
  std::set<std::string> keys;
  for (const auto& a : axes) {
    if (!keys.insert(a.key).second)
      throw Error("--grid: key '" + a.key + "' is given twice (list all values in one --grid)");
    if (a.values.empty()) throw Error("--grid: key '" + a.key + "' has no values");
  }
  const std::vector<std::string> names = short_names(axes);
  std::vector<SweepPoint> points(1);
  for (size_t i = 0; i < axes.size(); ++i) {
    std::vector<SweepPoint> next;
    for (const auto& p : points) {
      for (const auto& v : axes[i].values) {
        SweepPoint q = p;
        q.settings.emplace_back(axes[i].key, v);
        if (!q.name.empty()) q.name += ',';
        q.name += directory_safe(names[i] + "=" + v);
        next.push_back(std::move(q));
      }
    }
    points = std::move(next);
  }
  if (axes.empty()) points[0].name = "run";
  return points;
}

std::vector<int64_t> loss_spikes(const std::vector<double>& losses, const LossSpikeRule& rule) {
  SpikeDetector detector(rule.ratio, rule.window);  // the trainer's rule (train/stability.h)
  std::vector<int64_t> spikes;
  for (size_t i = 0; i < losses.size(); ++i) {
    if (!std::isfinite(losses[i])) continue;
    if (detector.check(losses[i])) spikes.push_back(static_cast<int64_t>(i));
    detector.accept(losses[i]);
  }
  return spikes;
}

SweepRunSummary summarize_sweep_run(const std::string& run_dir, const LossSpikeRule& rule) {
  SweepRunSummary s;
  s.run_dir = run_dir;
  s.name = fs::path(run_dir).filename().string();
  s.status = "pending";
  const fs::path point_file = fs::path(run_dir) / "sweep_point.json";
  if (fs::exists(point_file)) {
    const json j = read_json_file(point_file.string());
    s.status = j.value("status", "pending");
    s.message = j.value("message", "");
  }
  if (fs::exists(fs::path(run_dir) / "checkpoints" / "final")) s.status = "finished";
  std::vector<double> losses;
  std::vector<int64_t> steps;
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  if (fs::exists(metrics)) {
    for_each_json_line(metrics.string(), [&](const json& line, const std::string&) {
      if (line.contains("loss") && line["loss"].is_number()) {
        losses.push_back(line["loss"].get<double>());
        steps.push_back(line.value("step", static_cast<int64_t>(losses.size())));
      }
      if (line.contains("valid_loss") && line["valid_loss"].is_number()) s.final_valid_loss = line["valid_loss"];
    });
  }
  s.steps = static_cast<int64_t>(losses.size());
  if (!losses.empty()) {
    s.first_loss = losses.front();
    s.min_loss = *std::min_element(losses.begin(), losses.end());
    const size_t tail = std::min<size_t>(10, losses.size());
    double sum = 0;
    for (size_t i = losses.size() - tail; i < losses.size(); ++i) sum += losses[i];
    s.final_loss = sum / static_cast<double>(tail);
  }
  for (int64_t i : loss_spikes(losses, rule)) s.spike_steps.push_back(steps[i]);
  s.diverged = s.status == "diverged" || (s.status == "finished" && s.steps > 1 && !(s.final_loss < s.first_loss));
  return s;
}

namespace {

json to_json(const SweepRunSummary& s) {
  json settings = json::object();
  for (const auto& [k, v] : s.settings) settings[k] = v;
  return {{"name", s.name},
          {"run_dir", s.run_dir},
          {"settings", settings},
          {"status", s.status},
          {"message", s.message},
          {"steps", s.steps},
          {"first_loss", s.first_loss},
          {"final_loss", s.final_loss},
          {"min_loss", s.min_loss},
          {"final_valid_loss", s.final_valid_loss < 0 ? json(nullptr) : json(s.final_valid_loss)},
          {"diverged", s.diverged},
          {"spikes", static_cast<int64_t>(s.spike_steps.size())},
          {"spike_steps", s.spike_steps}};
}

}  // namespace

SweepResult run_sweep(const SweepOptions& o,
                      const std::function<void(size_t, size_t, const SweepRunSummary&)>& on_point) {
  const std::vector<SweepPoint> points = expand_sweep_grid(o.axes);
  SweepResult result;
  result.out_dir = o.out_dir.empty() ? TrainConfig::load(o.config, o.overrides).run_dir : o.out_dir;
  if (result.out_dir.empty()) throw Error(o.config + ": no train.run_dir, and no --out for the sweep");

  // Every point's configuration first: a typo in a grid value fails before hours of training.
  std::vector<TrainConfig> configs;
  for (const auto& p : points) {
    std::vector<std::string> overrides = o.overrides;
    for (const auto& [k, v] : p.settings) overrides.push_back(k + "=" + v);
    overrides.push_back("train.run_dir=" + (fs::path(result.out_dir) / p.name).string());
    try {
      configs.push_back(TrainConfig::load(o.config, overrides));
      // The model's own keys are checked here too, unless it comes from init_from (checked when it loads).
      if (!configs.back().preset.empty() || !configs.back().model_config.empty()) configs.back().model();
    } catch (const Error& e) {
      throw Error("sweep point '" + p.name + "': " + e.what());
    }
  }
  if (!o.dry_run) fs::create_directories(result.out_dir);

  auto record = [&](const SweepPoint& p, const std::string& status, const std::string& message) {
    write_text_file_atomically((fs::path(configs[&p - points.data()].run_dir) / "sweep_point.json").string(),
                               json{{"status", status}, {"message", message}}.dump(2) + "\n");
  };
  for (size_t i = 0; i < points.size(); ++i) {
    const SweepPoint& p = points[i];
    const std::string run_dir = configs[i].run_dir;
    SweepRunSummary before = summarize_sweep_run(run_dir, o.spikes);
    const bool skip = before.status == "finished" || (!o.retry_diverged && before.status == "diverged");
    if (!o.dry_run && !skip && result.stopped_by_signal == 0) {
      fs::create_directories(run_dir);
      TrainOptions train;
      train.resume = !latest_checkpoint(run_dir).empty();
      try {
        const TrainResult r = run_training(configs[i], train);
        if (r.stopped_by_signal) {
          result.stopped_by_signal = r.stopped_by_signal;
          record(p, "interrupted", "stopped by signal " + std::to_string(r.stopped_by_signal));
        } else {
          record(p, "finished", "");
        }
      } catch (const Error& e) {
        const std::string what = e.what();
        record(p, what.find("training diverged") != std::string::npos ? "diverged" : "failed", what);
      }
    }
    SweepRunSummary s = summarize_sweep_run(run_dir, o.spikes);
    s.name = p.name;
    s.settings = p.settings;
    result.runs.push_back(s);
    if (on_point) on_point(i, points.size(), s);
  }
  json summary = {{"config", o.config}, {"overrides", o.overrides}, {"runs", json::array()}};
  summary["spike_rule"] = {{"window", o.spikes.window}, {"ratio", o.spikes.ratio}};
  for (const auto& s : result.runs) summary["runs"].push_back(to_json(s));
  if (!o.dry_run)
    write_text_file_atomically((fs::path(result.out_dir) / "sweep.json").string(), summary.dump(2) + "\n");
  return result;
}

}  // namespace archspace
