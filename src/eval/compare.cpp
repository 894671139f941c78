#include "archspace/eval/compare.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "archspace/eval/generation_metrics.h"
#include "archspace/eval/multiple_choice_task_family.h"
#include "archspace/eval/seed_statistics.h"
#include "archspace/eval/suites.h"
#include "archspace/eval/task_groups.h"
#include "archspace/io/run_dir.h"
#include "archspace/text/python_str.h"
#include "archspace/text/utf8.h"
#include "archspace/util/error.h"
#include "archspace/util/json_file.h"
#include "archspace/util/strings.h"

namespace archspace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- statistics -------------------------------------------------------------------------------------

uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

double linear_quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) throw Error("linear_quantile: no values");
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

double mcnemar_exact_p(int64_t b, int64_t c) {
  const int64_t n = b + c;
  if (n == 0) return 1.0;
  // 2 * P(X <= min(b, c)) for X ~ Binomial(n, 1/2), summed in log space (n reaches thousands).
  const int64_t k = std::min(b, c);
  const double log_half_n = static_cast<double>(n) * std::log(0.5);
  double sum = 0;
  for (int64_t i = 0; i <= k; ++i) {
    const double log_choose = std::lgamma(static_cast<double>(n + 1)) - std::lgamma(static_cast<double>(i + 1)) -
                              std::lgamma(static_cast<double>(n - i + 1));
    sum += std::exp(log_choose + log_half_n);
  }
  return std::min(1.0, 2.0 * sum);
}

std::vector<double> holm_adjust(const std::vector<double>& p) {
  const size_t m = p.size();
  std::vector<size_t> order(m);
  for (size_t i = 0; i < m; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return p[x] < p[y]; });
  std::vector<double> adjusted(m);
  double running = 0;  // adjusted values never decrease along the sorted order
  for (size_t j = 0; j < m; ++j) {
    running = std::max(running, std::min(1.0, static_cast<double>(m - j) * p[order[j]]));
    adjusted[order[j]] = running;
  }
  return adjusted;
}

std::vector<double> ema_smooth(const std::vector<double>& values, double weight) {
  std::vector<double> out;
  double last = 0, norm = 0;
  for (double v : values) {
    last = weight * last + (1 - weight) * v;
    norm = weight * norm + (1 - weight);
    out.push_back(last / norm);
  }
  return out;
}

std::optional<double> tokens_to_reach(const std::vector<double>& tokens, const std::vector<double>& loss,
                                      double level) {
  for (size_t i = 0; i < loss.size(); ++i) {
    if (loss[i] <= level) return tokens[i];
  }
  return std::nullopt;
}

namespace {

std::vector<double> mean_over_runs(const std::vector<std::vector<double>>& runs, const std::vector<int64_t>& pick) {
  std::vector<double> m(runs.front().size(), 0.0);
  for (int64_t r : pick) {
    for (size_t i = 0; i < m.size(); ++i) m[i] += runs[static_cast<size_t>(r)][i];
  }
  for (double& v : m) v /= static_cast<double>(pick.size());
  return m;
}

std::vector<int64_t> all_runs(size_t k) {
  std::vector<int64_t> v(k);
  for (size_t i = 0; i < k; ++i) v[i] = static_cast<int64_t>(i);
  return v;
}

bool zero_one(const std::vector<std::vector<double>>& runs) {
  for (const auto& r : runs) {
    for (double v : r) {
      if (v != 0.0 && v != 1.0) return false;
    }
  }
  return true;
}

}  // namespace

PairedResult paired_bootstrap(const PairedTask& task, int64_t resamples, uint64_t seed, int64_t task_index,
                              double level) {
  const size_t ka = task.a.size(), kb = task.b.size();
  if (ka == 0 || kb == 0) throw Error("paired_bootstrap: task " + task.task + " has no runs on a side");
  const size_t n = task.a.front().size();
  if (n == 0) throw Error("paired_bootstrap: task " + task.task + " has no instances");
  PairedResult r;
  const std::vector<double> ma = mean_over_runs(task.a, all_runs(ka)), mb = mean_over_runs(task.b, all_runs(kb));
  for (size_t i = 0; i < n; ++i) {
    r.mean_a += ma[i];
    r.mean_b += mb[i];
  }
  r.mean_a /= static_cast<double>(n);
  r.mean_b /= static_cast<double>(n);
  r.diff = r.mean_b - r.mean_a;

  SplitMix64 rng(splitmix64_mix(seed + static_cast<uint64_t>(task_index)));
  const bool several = ka > 1 || kb > 1;
  std::vector<double> d(n);  // per-instance difference of the (resampled) runs' means
  if (!several) {
    for (size_t i = 0; i < n; ++i) d[i] = task.b[0][i] - task.a[0][i];
  }
  std::vector<int64_t> pick_a(ka), pick_b(kb);
  r.resampled.resize(static_cast<size_t>(resamples));
  const int64_t nn = static_cast<int64_t>(n);
  for (int64_t s = 0; s < resamples; ++s) {
    if (several) {
      for (auto& x : pick_a) x = rng.index(static_cast<int64_t>(ka));
      for (auto& x : pick_b) x = rng.index(static_cast<int64_t>(kb));
      const std::vector<double> ra = mean_over_runs(task.a, pick_a), rb = mean_over_runs(task.b, pick_b);
      for (size_t i = 0; i < n; ++i) d[i] = rb[i] - ra[i];
    }
    double sum = 0;
    for (int64_t i = 0; i < nn; ++i) sum += d[static_cast<size_t>(rng.index(nn))];
    r.resampled[static_cast<size_t>(s)] = sum / static_cast<double>(n);
  }
  std::vector<double> sorted = r.resampled;
  std::sort(sorted.begin(), sorted.end());
  r.low = linear_quantile(sorted, (1 - level) / 2);
  r.high = linear_quantile(sorted, 1 - (1 - level) / 2);

  if (!several && zero_one(task.a) && zero_one(task.b)) {
    for (size_t i = 0; i < n; ++i) {
      r.only_a += task.a[0][i] > task.b[0][i];
      r.only_b += task.b[0][i] > task.a[0][i];
    }
    r.test = "mcnemar_exact";
    r.p = mcnemar_exact_p(r.only_a, r.only_b);
  } else {
    // The percentile bootstrap's two-sided p: twice the smaller share of resamples on either side of 0.
    int64_t below = 0, above = 0;
    for (double v : r.resampled) {
      below += v <= 0;
      above += v >= 0;
    }
    r.test = "bootstrap";
    r.p = std::min(1.0, 2.0 * static_cast<double>(std::min(below, above)) / static_cast<double>(resamples));
  }
  return r;
}

// ---- reading runs -----------------------------------------------------------------------------------

namespace {

// Every line of a JSON-lines file, each an object; a line that is not (a truncated write) names file and line.
std::vector<std::pair<int64_t, json>> read_json_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open");
  std::vector<std::pair<int64_t, json>> rows;
  int64_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = parse_json_text(line, path + ":" + std::to_string(number));
    } catch (const std::exception& e) {
      throw Error(path + ":" + std::to_string(number) + ": not a JSON object (a truncated line?): " + e.what());
    }
    if (!j.is_object()) throw Error(path + ":" + std::to_string(number) + ": not a JSON object");
    rows.emplace_back(number, std::move(j));
  }
  return rows;
}

struct StepPoint {
  int64_t step = 0;
  double tokens = 0, loss = 0, lr = 0;
  std::string batch_hash;
};

struct Run {
  std::string dir;
  std::vector<StepPoint> steps;
  std::vector<std::pair<double, double>> valid;  // (tokens, valid_loss)
  std::vector<int64_t> valid_steps;
  json state;                                 // the newest checkpoint's trainer_state.json, or null
  std::map<std::string, std::string> config;  // train_config.toml flattened: "section.key" -> value
};

double number_field(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number()) throw Error(where + ": field \"" + key + "\" is not a number");
  return j[key].get<double>();
}

void flatten(const toml::table& t, const std::string& prefix, std::map<std::string, std::string>& out) {
  for (const auto& [key, node] : t) {
    const std::string name = prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    if (const auto* sub = node.as_table()) {
      flatten(*sub, name, out);
    } else {
      std::ostringstream os;
      node.visit([&](const auto& v) { os << v; });
      out[name] = os.str();
    }
  }
}

Run read_run(const std::string& dir) {
  Run r;
  r.dir = dir;
  if (!fs::is_directory(dir)) throw Error(dir + ": not a run directory");
  const std::string metrics = (fs::path(dir) / "metrics.jsonl").string();
  if (!fs::exists(metrics)) throw Error(dir + ": no metrics.jsonl (not a training run's directory?)");
  for (const auto& [number, j] : read_json_lines(metrics)) {
    const std::string where = metrics + ":" + std::to_string(number);
    if (j.contains("loss")) {
      StepPoint p;
      p.step = static_cast<int64_t>(number_field(j, "step", where));
      p.tokens = number_field(j, "tokens", where);
      p.loss = number_field(j, "loss", where);
      if (j.contains("lr") && j["lr"].is_number()) p.lr = j["lr"].get<double>();
      if (j.contains("batch_hash") && j["batch_hash"].is_string()) p.batch_hash = j["batch_hash"];
      r.steps.push_back(p);
    } else if (j.contains("valid_loss")) {
      r.valid.emplace_back(number_field(j, "tokens", where), number_field(j, "valid_loss", where));
      r.valid_steps.push_back(static_cast<int64_t>(number_field(j, "step", where)));
    }
  }
  if (r.steps.empty()) throw Error(metrics + ": no training steps (lines with \"loss\")");
  const std::string checkpoint = latest_checkpoint(dir);
  if (!checkpoint.empty()) {
    const fs::path state = fs::path(checkpoint) / "trainer_state.json";
    if (fs::exists(state)) r.state = read_json_file(state.string());
    const fs::path config = fs::path(checkpoint) / "train_config.toml";
    if (fs::exists(config)) {
      try {
        flatten(toml::parse_file(config.string()), "", r.config);
      } catch (const toml::parse_error& e) {
        throw Error(config.string() + ": malformed TOML: " + std::string(e.description()));
      }
    }
  }
  return r;
}

std::string fmt(double v) {
  char s[64];
  std::snprintf(s, sizeof(s), "%.6g", v);
  return s;
}

// Two values that differ only where each names its own run's model.variant (a sweep's "config-{variant}.json"
// expands to each variant's model config): the change under test, not a mismatch.
bool same_but_variant(const Run& a, const Run& b, const std::string& va, const std::string& vb) {
  const auto variant = [](const Run& r) {  // the flattened TOML value, its quotes dropped
    const auto it = r.config.find("model.variant");
    std::string v = it == r.config.end() ? std::string() : it->second;
    if (v.size() >= 2 && (v.front() == '\'' || v.front() == '"') && v.back() == v.front())
      v = v.substr(1, v.size() - 2);
    return v;
  };
  const std::string xa = variant(a), xb = variant(b);
  if (xa.empty() || xb.empty() || xa == xb) return false;
  std::string ta = va, tb = vb;
  text::replace_all(ta, xa, "{variant}");
  text::replace_all(tb, xb, "{variant}");
  return ta == tb;
}

// The differences between two runs that a matched comparison must not have, each named. across_seeds: two runs of
// one side, which differ in their seed (and so in their batches) by design: those two checks are skipped.
json match_checks(const Run& a, const Run& b, bool across_seeds = false) {
  json checks = json::array();
  const auto add = [&](const std::string& what, bool same, const std::string& detail) {
    checks.push_back({{"what", what}, {"same", same}, {"detail", detail}});
  };
  // Batches, step for step.
  const size_t common = std::min(a.steps.size(), b.steps.size());
  int64_t differ = 0, first = -1, missing = 0;
  for (size_t i = 0; i < common && !across_seeds; ++i) {
    if (a.steps[i].batch_hash.empty() || b.steps[i].batch_hash.empty()) {
      ++missing;
    } else if (a.steps[i].batch_hash != b.steps[i].batch_hash) {
      if (first < 0) first = a.steps[i].step;
      ++differ;
    }
  }
  if (across_seeds) {  // another seed, other batches: nothing to check
  } else if (missing > 0) {
    add("batches", false, std::to_string(missing) + " steps without a batch_hash: the batches cannot be checked");
  } else {
    add("batches", differ == 0,
        differ == 0 ? "the same batch hash at each of " + std::to_string(common) + " steps"
                    : std::to_string(differ) + " of " + std::to_string(common) +
                          " steps saw different batches, the first at step " + std::to_string(first));
  }
  add("steps", a.steps.size() == b.steps.size(),
      std::to_string(a.steps.size()) + " vs " + std::to_string(b.steps.size()) + " training steps");
  // Schedule: the learning rate at every common step.
  size_t lr_first = common;
  for (size_t i = 0; i < common && lr_first == common; ++i) {
    if (std::abs(a.steps[i].lr - b.steps[i].lr) > 1e-12 * std::max(std::abs(a.steps[i].lr), 1e-30)) lr_first = i;
  }
  add("schedule", lr_first == common,
      lr_first == common ? "the same learning rate at every step"
                         : "the learning rates differ from step " + std::to_string(a.steps[lr_first].step) + " (" +
                               fmt(a.steps[lr_first].lr) + " vs " + fmt(b.steps[lr_first].lr) + ")");
  // Tokens: per step and in all.
  int64_t tok_first = -1;
  for (size_t i = 0; i < common && tok_first < 0; ++i) {
    if (a.steps[i].tokens != b.steps[i].tokens) tok_first = a.steps[i].step;
  }
  add("tokens", tok_first < 0 && a.steps.back().tokens == b.steps.back().tokens,
      fmt(a.steps.back().tokens) + " vs " + fmt(b.steps.back().tokens) + " tokens" +
          (tok_first < 0 ? "" : ", the counts differ from step " + std::to_string(tok_first)));
  // Seed and batch shape from the newest checkpoints' trainer state.
  if (a.state.is_null() || b.state.is_null()) {
    add(across_seeds ? "trainer_state" : "seed", false,
        "no checkpoint's trainer_state.json in " + (a.state.is_null() ? a.dir : b.dir));
  } else {
    for (const char* key : {"seed", "sequence_length", "global_batch", "data_mixture"}) {
      if (across_seeds && std::string(key) == "seed") continue;
      const json va = a.state.value(key, json()), vb = b.state.value(key, json());
      if (va.is_null() && vb.is_null()) continue;
      add(key, va == vb, va.dump() + " vs " + vb.dump());
    }
  }
  // Evaluation settings: which validation losses at which steps.
  add("validation", a.valid_steps == b.valid_steps,
      std::to_string(a.valid_steps.size()) + " vs " + std::to_string(b.valid_steps.size()) + " validation points" +
          (a.valid_steps == b.valid_steps ? " at the same steps" : " (steps differ)"));
  // The run configs, except the change under test and where each run writes.
  if (!a.config.empty() && !b.config.empty()) {
    std::set<std::string> keys;
    for (const auto& [k, v] : a.config) keys.insert(k);
    for (const auto& [k, v] : b.config) keys.insert(k);
    std::string detail;
    for (const auto& k : keys) {
      if (k == "model.variant" || k == "train.run_dir" || k.rfind("checkpoint.", 0) == 0 ||
          k.rfind("tracking.", 0) == 0 || k == "model.init_from" || (across_seeds && k == "train.seed"))
        continue;
      const auto ia = a.config.find(k), ib = b.config.find(k);
      const std::string va = ia == a.config.end() ? "(unset)" : ia->second;
      const std::string vb = ib == b.config.end() ? "(unset)" : ib->second;
      if (va != vb && !(k == "model.config" && same_but_variant(a, b, va, vb)))
        detail += (detail.empty() ? "" : "; ") + k + ": " + va + " vs " + vb;
    }
    add("config", detail.empty(), detail.empty() ? "the same train_config.toml but model.variant and paths" : detail);
  }
  return checks;
}

// ---- evaluation rows -----------------------------------------------------------------------------------

struct Instance {
  double value = 0;
  json gold;
  std::string where;  // file:line of its (first) row
};
struct TaskRows {
  std::string metric, format;
  json shots;
  std::map<std::string, Instance> docs;  // doc_id (as text) -> instance
  std::vector<std::string> order;        // the doc_ids in file order: the bootstrap's instance order
  void add(const std::string& doc, Instance instance) {
    if (docs.emplace(doc, std::move(instance)).second) order.push_back(doc);
  }
};
using Rows = std::map<std::string, TaskRows>;  // task -> rows

int64_t utf8_chars(const std::string& s) { return std::max<int64_t>(text::utf8_character_count(s), 1); }

// A log-likelihood row's document: its choices, gold label and (when its family reads them) its own labels.
struct Choice {
  int64_t idx;
  double ll, tokens, chars;
};
struct ChoiceDoc {
  std::vector<Choice> choices;
  int64_t label = 0;
  std::string where;
  json own_labels;  // the row's family labels field (TruthfulQA's multi_true)
};
struct ChoiceRows {
  std::map<std::string, std::map<std::string, ChoiceDoc>> docs;  // task -> doc_id -> document
  std::map<std::string, std::vector<std::string>> order;         // task -> doc_ids in file order
  // acc_uncond's normalisers: task -> (the conditional doc_id, idx) -> the unconditional log-likelihood.
  std::map<std::string, std::map<std::pair<std::string, int64_t>, double>> uncond;
};

// A generation row: the instance's primary metric.
void add_generation_row(const json& j, const std::string& task, const std::string& doc, const std::string& where,
                        TaskRows& t) {
  const GenerationTaskSpec* spec = find_generation_task(task);
  const std::string metric = j.contains("primary_metric") && j["primary_metric"].is_string()
                                 ? j["primary_metric"].get<std::string>()
                             : spec ? spec->primary_metric
                                    : "";
  if (metric.empty()) throw Error(where + ": task " + task + " is no generation task known here");
  if (!j.contains("metrics") || !j["metrics"].is_object() || !j["metrics"].contains(metric) ||
      !j["metrics"][metric].is_number())
    throw Error(where + ": no number \"metrics\"." + metric + " (the task's primary metric)");
  t.metric = metric;
  if (t.docs.count(doc)) throw Error(where + ": task " + task + " doc_id " + doc + " appears twice");
  t.add(doc, {j["metrics"][metric].get<double>(), j.value("gold", json()), where});
}

// The primary metrics compare scores from log-likelihood rows: the ranked accuracies, and those a family scores from
// its documents' own labels.
std::vector<std::string> row_metrics() {
  std::vector<std::string> metrics = {"acc_raw", "acc_per_token", "acc_per_char", "acc_uncond"};
  for (const auto* family : multiple_choice_task_families()) {
    for (const auto& m : family->document_metrics()) metrics.push_back(m);
  }
  return metrics;
}

// A log-likelihood row (one choice of a document, or its unconditional normaliser).
void add_choice_row(const json& j, const std::string& task, const std::string& doc, const std::string& where,
                    TaskRows& t, ChoiceRows& out) {
  for (const char* key : {"loglikelihood", "n_continuation_tokens", "idx", "label"}) {
    if (!j.contains(key) || !j[key].is_number())
      throw Error(where + ": no number \"" + std::string(key) +
                  "\" (a log-likelihood row; rows without \"label\" come from before compare existed: "
                  "rerun eval downstream --requests-out)");
  }
  if (j.value("unconditional", false)) {  // the acc_uncond normaliser of a choice
    if (!j.contains("uncond_offset") || !j["uncond_offset"].is_number_integer() || !j["doc_id"].is_number_integer())
      throw Error(where +
                  ": an unconditional row needs an integer \"doc_id\" and \"uncond_offset\" (rerun eval "
                  "downstream --requests-out)");
    const int64_t conditional = j["doc_id"].get<int64_t>() - j["uncond_offset"].get<int64_t>();
    out.uncond[task][{std::to_string(conditional), j["idx"].get<int64_t>()}] = j["loglikelihood"].get<double>();
    return;
  }
  const std::string metric = j.value("primary_metric", "");
  static const std::vector<std::string> scored = row_metrics();
  if (std::find(scored.begin(), scored.end(), metric) == scored.end())
    throw Error(where + ": task " + task + "'s primary metric \"" + metric +
                "\" is not one compare scores from rows (" + join(scored) + ")");
  const MultipleChoiceTaskFamily& family = multiple_choice_task_family(task);
  const std::vector<std::string> own = family.document_metrics();
  const std::string field = family.document_labels_field();
  if (std::find(own.begin(), own.end(), metric) != own.end() && (!j.contains(field) || !j[field].is_object()))
    throw Error(where + ": task " + task + " is scored by " + metric + ", which needs the row's \"" + field +
                "\" labels (rerun eval downstream --requests-out)");
  t.metric = metric;
  ChoiceDoc& d = out.docs[task][doc];
  if (d.choices.empty()) {
    d.where = where;
    out.order[task].push_back(doc);
  }
  if (!field.empty() && j.contains(field)) d.own_labels = j[field];
  d.label = j["label"].get<int64_t>();
  d.choices.push_back({j["idx"].get<int64_t>(), j["loglikelihood"].get<double>(),
                       std::max(1.0, j["n_continuation_tokens"].get<double>()),
                       static_cast<double>(utf8_chars(j.value("continuation", "")))});
}

// One document's value under its task's primary metric, as eval/downstream.cpp's task_metrics scores it: argmax over
// the choices (the first maximum on ties) against the label, or its family's metric from its own labels.
Instance score_choices(const std::string& task, const std::string& doc, ChoiceDoc& d, const std::string& metric,
                       const std::map<std::pair<std::string, int64_t>, double>& uncond) {
  std::sort(d.choices.begin(), d.choices.end(), [](const Choice& x, const Choice& y) { return x.idx < y.idx; });
  const MultipleChoiceTaskFamily& family = multiple_choice_task_family(task);
  const std::vector<std::string> own = family.document_metrics();
  if (std::find(own.begin(), own.end(), metric) != own.end()) {
    try {
      std::map<int64_t, double> ll;
      for (const Choice& c : d.choices) ll[c.idx] = c.ll;
      return {family.document_metric(metric, d.own_labels, ll), d.own_labels, d.where};
    } catch (const std::exception& e) {
      throw Error(d.where + ": task " + task + " doc_id " + doc + ": its " + family.document_labels_field() +
                  " labels do not fit its choices (" + e.what() + ")");
    }
  }
  size_t best = 0;
  double best_score = -INFINITY;
  for (size_t i = 0; i < d.choices.size(); ++i) {
    const Choice& c = d.choices[i];
    double s = metric == "acc_per_token" ? c.ll / c.tokens : metric == "acc_per_char" ? c.ll / c.chars : c.ll;
    if (metric == "acc_uncond") {  // the choice's log-likelihood over its unconditional one (PMI)
      const auto it = uncond.find({doc, c.idx});
      if (it == uncond.end())
        throw Error(d.where + ": task " + task + " doc_id " + doc + " choice " + std::to_string(c.idx) +
                    " has no unconditional row (acc_uncond)");
      s -= it->second;
    }
    if (s > best_score) {
      best_score = s;
      best = i;
    }
  }
  return {d.choices[best].idx == d.label ? 1.0 : 0.0, json(d.label), d.where};
}

// One side's requests-out file: generation rows give their primary metric; log-likelihood rows (one per
// choice) give the document's value under the task's primary metric (score_choices).
Rows read_requests(const std::string& path) {
  Rows rows;
  ChoiceRows choices;
  const auto rows_in = read_json_lines(path);
  if (rows_in.empty()) throw Error(path + ": no rows (zero instances)");
  for (const auto& [number, j] : rows_in) {
    const std::string where = path + ":" + std::to_string(number);
    if (!j.contains("task") || !j["task"].is_string()) throw Error(where + ": no \"task\" field");
    if (!j.contains("doc_id") || !(j["doc_id"].is_number_integer() || j["doc_id"].is_string()))
      throw Error(where + ": no \"doc_id\" field");
    const std::string task = j["task"];
    const std::string doc = j["doc_id"].is_string() ? j["doc_id"].get<std::string>() : j["doc_id"].dump();
    TaskRows& t = rows[task];
    t.format = j.value("format", "");
    if (j.contains("shots")) t.shots = j["shots"];
    if (j.contains("generation")) {
      add_generation_row(j, task, doc, where, t);
    } else {
      add_choice_row(j, task, doc, where, t, choices);
    }
  }
  for (auto& [task, docs] : choices.docs) {
    TaskRows& t = rows[task];
    for (const auto& doc : choices.order.at(task))
      t.add(doc, score_choices(task, doc, docs.at(doc), t.metric, choices.uncond[task]));
  }
  return rows;
}

// Several runs of one side: the same tasks and instances (with the same gold) in each.
std::vector<Rows> read_side(const std::vector<std::string>& files) {
  std::vector<Rows> side;
  for (const auto& f : files) side.push_back(read_requests(f));
  for (size_t r = 1; r < side.size(); ++r) {
    for (const auto& [task, t] : side[0]) {
      if (!side[r].count(task)) throw Error(files[r] + ": task " + task + " (in " + files[0] + ") is missing");
      for (const auto& [doc, inst] : t.docs) {
        const auto it = side[r].at(task).docs.find(doc);
        if (it == side[r].at(task).docs.end())
          throw Error(files[r] + ": task " + task + " doc_id " + doc + " (" + inst.where + ") is missing");
      }
    }
  }
  return side;
}

std::string md_number(double v, int digits = 2) { return format_string("%.*f", digits, v); }

// A difference of resampled task differences: its percentile interval and the bootstrap's two-sided p.
json resampled_row(double a, double b, const std::vector<double>& resampled) {
  std::vector<double> sorted = resampled;
  std::sort(sorted.begin(), sorted.end());
  int64_t below = 0, above = 0;
  for (double v : resampled) {
    below += v <= 0;
    above += v >= 0;
  }
  return {{"a", a},
          {"b", b},
          {"diff", b - a},
          {"low", linear_quantile(sorted, 0.025)},
          {"high", linear_quantile(sorted, 0.975)},
          {"p", std::min(1.0, 2.0 * static_cast<double>(std::min(below, above)) / static_cast<double>(sorted.size()))}};
}

// The suite's table (eval/suites.h) of paired differences: each of its tasks' rows, a group's at its primary
// aggregate (macro: the members' mean; micro: their instances pooled, each member weighted by its instances), each
// resample's the same aggregate of its members' resamples; then the macro over the rows present. A task whose rows
// are missing is named.
json suite_comparison(const std::string& name, const json& tasks, const std::vector<PairedResult>& results,
                      int64_t resamples) {
  const Suite* suite = find_suite(name);
  if (!suite) throw Error("compare: unknown suite \"" + name + "\" (" + join(suite_names()) + ")");
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < tasks.size(); ++i) index[tasks[i]["task"].get<std::string>()] = i;
  json rows = json::array(), missing = json::array();
  std::vector<double> macro(static_cast<size_t>(resamples), 0.0);
  double ma = 0, mb = 0;
  int64_t present = 0;
  for (const SuiteTask& t : suite->tasks) {
    const TaskGroup* group = find_task_group(t.name);
    const std::vector<std::string> members = group ? group->members : std::vector<std::string>{t.name};
    const bool micro = group && group->primary_aggregate == "micro";
    std::vector<std::string> absent;
    for (const auto& m : members) {
      if (!index.count(m)) absent.push_back(m);
    }
    if (!absent.empty()) {
      missing.push_back({{"task", t.name}, {"missing", absent}});
      continue;
    }
    double a = 0, b = 0, weights = 0;
    int64_t n = 0;
    std::vector<double> resampled(static_cast<size_t>(resamples), 0.0);
    for (const auto& m : members) {
      const json& row = tasks[index.at(m)];
      if (row["metric"] != t.metric)
        throw Error("compare: suite " + name + " scores " + t.name + " by " + t.metric + ", and " + m + "'s rows by " +
                    row["metric"].get<std::string>());
      const double w = micro ? row["n"].get<double>() : 1.0;
      a += w * row["a"].get<double>();
      b += w * row["b"].get<double>();
      for (size_t s = 0; s < resampled.size(); ++s) resampled[s] += w * results[index.at(m)].resampled[s];
      weights += w;
      n += row["n"].get<int64_t>();
    }
    for (double& v : resampled) v /= weights;
    json row = resampled_row(a / weights, b / weights, resampled);
    row["task"] = t.name;
    row["metric"] = t.metric;
    row["aggregate"] = group ? group->primary_aggregate : "task";
    row["n"] = n;
    rows.push_back(row);
    ma += a / weights;
    mb += b / weights;
    for (size_t s = 0; s < macro.size(); ++s) macro[s] += resampled[s];
    ++present;
  }
  json out = {{"name", name}, {"rows", rows}, {"missing", missing}};
  if (present > 0) {
    for (double& v : macro) v /= static_cast<double>(present);
    out["macro"] = resampled_row(ma / static_cast<double>(present), mb / static_cast<double>(present), macro);
  }
  return out;
}

// A task's seeds per arm to detect 1 and 2 points, from its runs' means (paired when every run has its seed's
// partner: `pairs`, A's and B's run indices); null with one run per side.
json task_seeds_needed(const PairedTask& p, const std::vector<std::pair<size_t, size_t>>& pairs) {
  if (p.a.size() < 2 && p.b.size() < 2) return nullptr;
  const auto means = [](const std::vector<std::vector<double>>& runs) {
    std::vector<double> m;
    for (const auto& r : runs) {
      double s = 0;
      for (double v : r) s += v;
      m.push_back(s / static_cast<double>(r.size()));
    }
    return m;
  };
  std::vector<double> a = means(p.a), b = means(p.b);
  if (!pairs.empty()) {
    std::vector<double> pa, pb;
    for (const auto& [i, j] : pairs) {
      pa.push_back(a[i]);
      pb.push_back(b[j]);
    }
    a = pa, b = pb;
  }
  return {{"sd", seed_spread(a, b, !pairs.empty())}, {"rows", seeds_needed_rows(a, b, !pairs.empty(), {0.01, 0.02})}};
}

// The tasks both sides evaluated (the same set on each, else an error naming those only one side has).
std::set<std::string> common_tasks(const CompareOptions& o, const Rows& a, const Rows& b) {
  std::set<std::string> tasks_a, tasks_b;
  for (const auto& [t, _] : a) tasks_a.insert(t);
  for (const auto& [t, _] : b) tasks_b.insert(t);
  if (tasks_a != tasks_b) {
    std::string only;
    for (const auto& t : tasks_a)
      if (!tasks_b.count(t)) only += " " + t + " (only in " + o.eval_a[0] + ")";
    for (const auto& t : tasks_b)
      if (!tasks_a.count(t)) only += " " + t + " (only in " + o.eval_b[0] + ")";
    throw Error("compare: the two sides evaluated different tasks:" + only);
  }
  return tasks_a;
}

// How the evaluation rows are compared, as compare.json states it.
json evaluation_method(const CompareOptions& o) {
  return {{"resamples", o.resamples},
          {"seed", o.seed},
          {"level", 0.95},
          {"runs_a", o.eval_a.size()},
          {"runs_b", o.eval_b.size()},
          {"rng",
           "SplitMix64; task t draws from state splitmix64_mix(seed + t); index = floor(u * n), "
           "u = (x >> 11) * 2^-53"},
          {"method", o.eval_a.size() > 1 || o.eval_b.size() > 1
                         ? "paired bootstrap over runs and instances: each resample draws the runs of each side "
                           "with replacement, then the instances with replacement; the difference is the mean "
                           "over drawn B runs minus drawn A runs; percentile interval; p: twice the smaller "
                           "share of resamples on either side of 0; Holm across the tasks"
                         : "paired bootstrap over instances (percentile interval); p: McNemar's exact test "
                           "for 0/1 metrics, else twice the smaller share of resamples on either side of 0; "
                           "Holm across the tasks"}};
}

// A task's instances on both sides with the same gold: A's in A's file order, then those only B has. Under
// --intersect the others are dropped and counted in `dropped`; else they are an error naming the row.
std::vector<std::string> paired_instances(const CompareOptions& o, const std::string& task, const TaskRows& ta,
                                          const TaskRows& tb, json& dropped) {
  std::vector<std::string> docs;
  int64_t only_one = 0, gold_differs = 0;
  std::vector<std::string> all = ta.order;
  for (const auto& d : tb.order)
    if (!ta.docs.count(d)) all.push_back(d);
  for (const auto& d : all) {
    const auto ia = ta.docs.find(d), ib = tb.docs.find(d);
    if (ia == ta.docs.end() || ib == tb.docs.end()) {
      if (!o.intersect)
        throw Error("compare: task " + task + " doc_id " + d + " is only in " +
                    (ia == ta.docs.end() ? ib->second.where : ia->second.where) +
                    " (--intersect drops such instances)");
      ++only_one;
      continue;
    }
    if (ia->second.gold != ib->second.gold) {
      if (!o.intersect)
        throw Error("compare: task " + task + " doc_id " + d + " has different gold in " + ia->second.where + " and " +
                    ib->second.where + " (--intersect drops such instances)");
      ++gold_differs;
      continue;
    }
    docs.push_back(d);
  }
  if (only_one + gold_differs > 0) dropped[task] = {{"only_one_side", only_one}, {"gold_differs", gold_differs}};
  if (docs.empty()) throw Error("compare: task " + task + " has no instance on both sides (zero instances)");
  return docs;
}

// Each run's values of `docs`, in that order.
std::vector<std::vector<double>> run_values(const std::vector<Rows>& side, const std::string& task,
                                            const std::vector<std::string>& docs) {
  std::vector<std::vector<double>> out;
  for (const auto& rows : side) {
    std::vector<double> v;
    for (const auto& d : docs) v.push_back(rows.at(task).docs.at(d).value);
    out.push_back(std::move(v));
  }
  return out;
}

json task_row(const std::string& task, const TaskRows& t, size_t n, const PairedResult& r) {
  return {{"task", task},   {"metric", t.metric}, {"format", t.format}, {"shots", t.shots}, {"n", n},
          {"a", r.mean_a},  {"b", r.mean_b},      {"diff", r.diff},     {"low", r.low},     {"high", r.high},
          {"test", r.test}, {"only_a", r.only_a}, {"only_b", r.only_b}, {"p", r.p}};
}

// The macro difference: the tasks' mean difference, each resample's from the tasks' own resamples (instances
// resampled within each task, the tasks independently).
json macro_row(const std::vector<PairedResult>& results, int64_t resamples) {
  std::vector<double> macro(static_cast<size_t>(resamples), 0.0);
  double diff = 0, ma = 0, mb = 0;
  for (const auto& r : results) {
    diff += r.diff;
    ma += r.mean_a;
    mb += r.mean_b;
    for (size_t s = 0; s < macro.size(); ++s) macro[s] += r.resampled[s];
  }
  const double k = static_cast<double>(results.size());
  for (double& v : macro) v /= k;
  json row = resampled_row(ma / k, mb / k, macro);
  row["diff"] = diff / k;  // the tasks' mean difference, as summed (b - a of the means may round apart)
  return row;
}

json evaluation(const CompareOptions& o, const std::vector<std::pair<size_t, size_t>>& pairs) {
  const std::vector<Rows> a = read_side(o.eval_a), b = read_side(o.eval_b);
  json out = evaluation_method(o);
  json tasks = json::array(), dropped = json::object();
  std::vector<PairedResult> results;
  int64_t task_index = 0;
  for (const auto& task : common_tasks(o, a[0], b[0])) {
    const TaskRows& ta = a[0].at(task);
    const TaskRows& tb = b[0].at(task);
    if (ta.metric != tb.metric)
      throw Error("compare: task " + task + " is scored by " + ta.metric + " in " + o.eval_a[0] + " but by " +
                  tb.metric + " in " + o.eval_b[0]);
    const std::vector<std::string> docs = paired_instances(o, task, ta, tb, dropped);
    PairedTask p;
    p.task = task;
    p.metric = ta.metric;
    p.a = run_values(a, task, docs);
    p.b = run_values(b, task, docs);
    PairedResult r = paired_bootstrap(p, o.resamples, o.seed, task_index++);
    tasks.push_back(task_row(task, ta, docs.size(), r));
    tasks.back()["seeds_needed"] = task_seeds_needed(p, pairs);
    results.push_back(std::move(r));
  }
  std::vector<double> p;
  for (const auto& r : results) p.push_back(r.p);
  const std::vector<double> holm = holm_adjust(p);
  for (size_t i = 0; i < tasks.size(); ++i) {
    tasks[i]["p_holm"] = holm[i];
    tasks[i]["significant"] = holm[i] < 0.05;
  }
  if (!o.suite.empty()) out["suite"] = suite_comparison(o.suite, tasks, results, o.resamples);
  out["tasks"] = tasks;
  out["macro"] = macro_row(results, o.resamples);
  out["dropped"] = dropped;
  return out;
}

// ---- convergence -----------------------------------------------------------------------------------------

// A side's training curve: the runs' mean loss at the steps all of them logged.
json side_curve(const std::vector<Run>& runs, double smooth) {
  std::map<int64_t, std::pair<double, std::vector<double>>> at;  // step -> (tokens, losses)
  for (const auto& r : runs) {
    for (const auto& s : r.steps) {
      at[s.step].first = s.tokens;
      at[s.step].second.push_back(s.loss);
    }
  }
  std::vector<double> tokens, loss, valid_tokens, valid_loss;
  for (const auto& [step, v] : at) {
    if (v.second.size() != runs.size()) continue;
    tokens.push_back(v.first);
    double m = 0;
    for (double x : v.second) m += x;
    loss.push_back(m / static_cast<double>(v.second.size()));
  }
  std::map<double, std::vector<double>> valid;
  for (const auto& r : runs) {
    for (const auto& [t, l] : r.valid) valid[t].push_back(l);
  }
  for (const auto& [t, ls] : valid) {
    if (ls.size() != runs.size()) continue;
    valid_tokens.push_back(t);
    double m = 0;
    for (double x : ls) m += x;
    valid_loss.push_back(m / static_cast<double>(ls.size()));
  }
  return {{"tokens", tokens},
          {"loss", loss},
          {"smoothed", ema_smooth(loss, smooth)},
          {"valid_tokens", valid_tokens},
          {"valid_loss", valid_loss}};
}

json convergence(const std::vector<Run>& a, const std::vector<Run>& b, const CompareOptions& o) {
  json ca = side_curve(a, o.smooth), cb = side_curve(b, o.smooth);
  const std::vector<double> ta = ca["tokens"], sa = ca["smoothed"], tb = cb["tokens"], sb = cb["smoothed"];
  std::vector<double> levels = o.levels;
  std::string chosen = "given with --levels";
  if (levels.empty() && !sa.empty() && !sb.empty()) {
    // Levels both smoothed curves reach: from the higher of their minima up to the lower of their starts.
    const double lo = std::max(*std::min_element(sa.begin(), sa.end()), *std::min_element(sb.begin(), sb.end()));
    const double hi = std::min(sa.front(), sb.front());
    if (hi > lo) {
      for (double f : {0.8, 0.6, 0.4, 0.2, 0.0}) levels.push_back(lo + f * (hi - lo));
    }
    chosen =
        "five evenly spaced between the lower of the two smoothed curves' first values and the higher of "
        "their minima (levels both reach)";
  }
  json rows = json::array();
  for (double level : levels) {
    const auto xa = tokens_to_reach(ta, sa, level), xb = tokens_to_reach(tb, sb, level);
    json row = {{"loss", level},
                {"tokens_a", xa ? json(*xa) : json()},
                {"tokens_b", xb ? json(*xb) : json()},
                {"ratio", xa && xb && *xa > 0 ? json(*xb / *xa) : json()}};
    rows.push_back(row);
  }
  return {
      {"smooth", o.smooth},
      {"rule", "training loss smoothed as `plot --smooth " + fmt(o.smooth) +
                   "` does (TensorBoard's debiased exponential moving average); a curve reaches a level at the first "
                   "logged step whose smoothed loss is at or below it, and its tokens are that step's tokens; with "
                   "several runs per side, the runs' mean loss at each step is smoothed"},
      {"levels_chosen", chosen},
      {"a", ca},
      {"b", cb},
      {"levels", rows}};
}

// ---- pairs and seeds -------------------------------------------------------------------------------------

// A run's seed from its newest checkpoint's trainer_state.json.
std::optional<int64_t> seed_of(const Run& r) {
  if (r.state.is_object() && r.state.contains("seed") && r.state["seed"].is_number_integer())
    return r.state["seed"].get<int64_t>();
  return std::nullopt;
}

// Which A run goes with which B run: runs of the same seed first (the same init and data order on both sides: the
// pairs the seed statistics use), then the runs left, in order, by position (their checks name what differs, the seed
// first); what is left after that is unpaired.
struct RunPairing {
  std::vector<std::pair<size_t, size_t>> pairs;
  size_t by_seed = 0;                 // the first by_seed pairs share their seed
  std::vector<std::string> unpaired;  // each named with its side and seed
  // Pairs of one seed each, covering every run: the comparison is paired by seed.
  bool all_by_seed() const { return unpaired.empty() && by_seed == pairs.size(); }
};

RunPairing pair_runs(const std::vector<Run>& a, const std::vector<Run>& b) {
  RunPairing p;
  std::vector<bool> used_a(a.size(), false), used_b(b.size(), false);
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < b.size() && seed_of(a[i]); ++j) {
      if (used_b[j] || seed_of(a[i]) != seed_of(b[j])) continue;
      used_a[i] = used_b[j] = true;
      p.pairs.emplace_back(i, j);
      break;
    }
  }
  p.by_seed = p.pairs.size();
  for (size_t i = 0, j = 0; i < a.size(); ++i) {
    if (used_a[i]) continue;
    while (j < b.size() && used_b[j]) ++j;
    if (j == b.size()) break;
    used_a[i] = used_b[j] = true;
    p.pairs.emplace_back(i, j);
  }
  const auto name = [&](const Run& r, const char* side) {
    const auto s = seed_of(r);
    return std::string(side) + " run " + r.dir + (s ? " (seed " + std::to_string(*s) + ")" : "");
  };
  for (size_t i = 0; i < a.size(); ++i) {
    if (!used_a[i]) p.unpaired.push_back(name(a[i], "A"));
  }
  for (size_t j = 0; j < b.size(); ++j) {
    if (!used_b[j]) p.unpaired.push_back(name(b[j], "B"));
  }
  return p;
}

struct MatchReport {
  json pairs = json::array(), differences = json::array();
};

// Every difference that voids the comparison, for every run of both sides: each pair's checks, each run against its
// side's first run (all but the seed and the batches), and the runs without a partner.
MatchReport match_report(const std::vector<Run>& a, const std::vector<Run>& b, const RunPairing& pairing) {
  MatchReport m;
  const bool several = a.size() > 1 || b.size() > 1;
  const auto note = [&](const json& checks, const std::string& where) {
    for (const auto& c : checks) {
      if (!c["same"].get<bool>())
        m.differences.push_back(c["what"].get<std::string>() + ": " + c["detail"].get<std::string>() + where);
    }
  };
  for (const auto& [i, j] : pairing.pairs) {
    json checks = match_checks(a[i], b[j]);
    note(checks, several ? " (" + a[i].dir + " vs " + b[j].dir + ")" : "");
    m.pairs.push_back({{"a", a[i].dir}, {"b", b[j].dir}, {"checks", checks}});
  }
  for (const auto& [side, runs] : {std::pair<const char*, const std::vector<Run>*>{"A", &a}, {"B", &b}}) {
    for (size_t r = 1; r < runs->size(); ++r)
      note(match_checks((*runs)[0], (*runs)[r], true),
           " (" + std::string(side) + ": " + (*runs)[0].dir + " vs " + (*runs)[r].dir + ")");
  }
  for (const auto& u : pairing.unpaired)
    m.differences.push_back("runs: " + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + "; " + u +
                            " has no partner");
  return m;
}

// The runs of one side at `steps` (each logged by every run of both sides), each run's loss smoothed.
SeedSide seed_side(const std::vector<Run>& runs, const std::vector<int64_t>& steps, double smooth) {
  SeedSide s;
  for (const auto& r : runs) {
    std::map<int64_t, const StepPoint*> at;
    for (const auto& p : r.steps) at[p.step] = &p;
    std::vector<double> loss;
    s.tokens.clear();
    for (int64_t step : steps) {
      loss.push_back(at.at(step)->loss);
      s.tokens.push_back(at.at(step)->tokens);
    }
    s.runs.push_back(r.dir);
    s.smoothed.push_back(ema_smooth(loss, smooth));
    s.final_valid.push_back(r.valid.empty() ? std::nullopt : std::optional<double>(r.valid.back().second));
  }
  return s;
}

// compare.json's "seeds" (eval/seed_statistics.h) at the steps every run of both sides logged with the same tokens,
// for the convergence section's loss levels.
json seeds(const std::vector<Run>& a, const std::vector<Run>& b, const std::vector<std::pair<size_t, size_t>>& pairs,
           const json& convergence, const CompareOptions& o) {
  std::map<int64_t, std::set<double>> tokens;  // step -> the token counts logged there
  std::map<int64_t, size_t> count;
  for (const auto* side : {&a, &b}) {
    for (const auto& r : *side) {
      for (const auto& p : r.steps) {
        tokens[p.step].insert(p.tokens);
        ++count[p.step];
      }
    }
  }
  std::vector<int64_t> steps;
  for (const auto& [step, n] : count) {
    if (n == a.size() + b.size() && tokens[step].size() == 1) steps.push_back(step);
  }
  if (steps.empty()) return {{"error", "no step logged by every run with the same tokens"}};
  std::vector<double> levels;
  for (const auto& l : convergence["levels"]) levels.push_back(l["loss"].get<double>());
  return seed_convergence(seed_side(a, steps, o.smooth), seed_side(b, steps, o.smooth), pairs, levels, o.resamples,
                          o.seed);
}

}  // namespace

nlohmann::json compare_runs(const CompareOptions& o) {
  if (o.a.empty() || o.b.empty()) throw Error("compare: each side needs at least one run directory");
  if (o.resamples < 100) throw Error("compare: --resamples must be at least 100");
  std::vector<std::string> eval_a = o.eval_a, eval_b = o.eval_b;
  const auto found = [](const std::vector<std::string>& runs) {
    std::vector<std::string> files;
    for (const auto& r : runs) {
      const fs::path f = fs::path(r) / "requests.jsonl";
      if (fs::exists(f)) files.push_back(f.string());
    }
    return files.size() == runs.size() ? files : std::vector<std::string>{};
  };
  if (eval_a.empty() && eval_b.empty()) {
    eval_a = found(o.a);
    eval_b = found(o.b);
    if (eval_a.empty() || eval_b.empty()) eval_a.clear(), eval_b.clear();
  }
  if (eval_a.empty() != eval_b.empty())
    throw Error("compare: give the evaluation rows of both sides (--eval-a and --eval-b)");

  std::vector<Run> a, b;
  for (const auto& d : o.a) a.push_back(read_run(d));
  for (const auto& d : o.b) b.push_back(read_run(d));
  json report = {{"a", o.a}, {"b", o.b}};
  const RunPairing pairing = pair_runs(a, b);
  report["pairing"] = pairing.all_by_seed() ? "seed" : "position";
  const MatchReport match = match_report(a, b, pairing);
  report["matched"] = match.differences.empty();
  report["differences"] = match.differences;
  report["pairs"] = match.pairs;
  report["convergence"] = convergence(a, b, o);
  if (a.size() > 1 || b.size() > 1)
    report["seeds"] = seeds(a, b, pairing.all_by_seed() ? pairing.pairs : std::vector<std::pair<size_t, size_t>>{},
                            report["convergence"], o);
  if (!eval_a.empty()) {
    if (eval_a.size() != o.a.size() || eval_b.size() != o.b.size())
      throw Error("compare: one evaluation file per run (" + std::to_string(o.a.size()) + " for A, " +
                  std::to_string(o.b.size()) + " for B), not " + std::to_string(eval_a.size()) + " and " +
                  std::to_string(eval_b.size()));
    CompareOptions e = o;
    e.eval_a = eval_a;
    e.eval_b = eval_b;
    report["evaluation"] =
        evaluation(e, pairing.all_by_seed() ? pairing.pairs : std::vector<std::pair<size_t, size_t>>{});
    report["evaluation"]["files_a"] = eval_a;
    report["evaluation"]["files_b"] = eval_b;
  }
  return report;
}

namespace {

// compare.md's suite table: one row per suite task (a group at its aggregate), then the macro.
std::string suite_markdown(const json& s) {
  std::ostringstream md;
  const auto pts = [](const json& v) { return md_number(100 * v.get<double>(), 1); };
  const auto line = [&](const std::string& task, const std::string& metric, const std::string& n, const json& r) {
    md << "| " << task << " | " << metric << " | " << n << " | " << pts(r["a"]) << " | " << pts(r["b"]) << " | "
       << (r["diff"].get<double>() >= 0 ? "+" : "") << pts(r["diff"]) << " | [" << pts(r["low"]) << ", "
       << pts(r["high"]) << "] | " << format_string("%.3g", r["p"].get<double>()) << " |\n";
  };
  md << "\n## Suite " << s["name"].get<std::string>()
     << "\n\nEach task's paired difference (a group at the suite's aggregate of its members: macro, or micro over "
        "their instances), its interval from the members' resamples; the macro over the rows. Values in points "
        "(x100).\n\n| task | metric | n | A | B | B - A | 95% interval | p (bootstrap) |\n"
        "|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : s["rows"]) {
    const std::string agg = r["aggregate"].get<std::string>();
    line(r["task"].get<std::string>(), r["metric"].get<std::string>() + (agg == "task" ? "" : " (" + agg + ")"),
         std::to_string(r["n"].get<int64_t>()), r);
  }
  if (s.contains("macro")) line("**macro**", "", "", s["macro"]);
  for (const auto& m : s["missing"])
    md << "\nMissing from the rows: " << m["task"].get<std::string>() << " (" << join(m["missing"]) << ")";
  if (!s["missing"].empty()) md << "\n";
  return md.str();
}

// compare.md's seeds section: the loss differences and tokens-to-reach ratios with their seed intervals.
std::string seeds_markdown(const json& s) {
  if (s.contains("error")) return "\n## Seeds\n\n" + s["error"].get<std::string>() + "\n";
  std::ostringstream md;
  const auto num = [](const json& v, int digits) { return v.is_null() ? std::string("-") : md_number(v, digits); };
  const auto interval = [&](const json& lo, const json& hi, int digits) {
    return lo.is_null() ? std::string("-") : "[" + num(lo, digits) + ", " + num(hi, digits) + "]";
  };
  md << "\n## Seeds\n\n"
     << s["runs_a"].get<int64_t>() << " runs of A, " << s["runs_b"].get<int64_t>() << " of B; "
     << s["method"].get<std::string>() << "; " << s["resamples"].get<int64_t>() << " resamples. Seeds per arm "
     << s["seeds_needed_rule"].get<std::string>() << ".\n\n"
     << "| B - A | tokens | diff | 95% seed resamples | 95% t | p (t) | seed sd | seeds per arm for 0.005 / 0.01 / "
        "0.02 / the observed |\n|---|---|---|---|---|---|---|---|\n";
  const auto row = [&](const std::string& what, const json& x, const std::string& tokens) {
    const json& t = x["t"];
    std::string needed;
    for (const auto& n : x["seeds_needed"])
      needed +=
          (needed.empty() ? "" : " / ") + (n["seeds_per_arm"].is_null() ? std::string("-") : n["seeds_per_arm"].dump());
    md << "| " << what << " | " << tokens << " | " << md_number(x["diff"], 4) << " | "
       << interval(x["bootstrap"]["low"], x["bootstrap"]["high"], 4) << " | "
       << (t.is_null() ? "-" : interval(t["low"], t["high"], 4)) << " | "
       << (t.is_null() ? "-" : format_string("%.3g", t["p"].get<double>())) << " | " << md_number(x["sd"], 4) << " | "
       << needed << " |\n";
  };
  for (const auto& x : s["loss_at_tokens"]) row("training loss (smoothed)", x, md_number(x["tokens"], 0));
  if (!s["final_valid"].is_null()) row("final validation loss", s["final_valid"], "end");
  md << "\n| loss level | tokens B/A | 95% seed resamples | resamples reaching it |\n|---|---|---|---|\n";
  for (const auto& x : s["tokens_to_reach"])
    md << "| " << md_number(x["loss"], 3) << " | " << (x["ratio"].is_null() ? "-" : num(x["ratio"], 3) + "x") << " | "
       << interval(x["low"], x["high"], 3) << " | " << x["defined"].get<int64_t>() << " |\n";
  return md.str();
}

}  // namespace

std::string compare_markdown(const nlohmann::json& r) {
  std::ostringstream md;
  md << "# compare: A = " << r["a"].dump() << ", B = " << r["b"].dump() << "\n\n";
  if (r["matched"].get<bool>()) {
    md << "**Matched**: the same batches step for step, schedule, seed, tokens and evaluation settings.\n\n";
  } else {
    md << "**Not matched**: every difference below.\n\n";
    for (const auto& d : r["differences"]) md << "- " << d.get<std::string>() << "\n";
    md << "\n";
  }
  const json& c = r["convergence"];
  md << "## Convergence\n\n"
     << c["rule"].get<std::string>() << ". Levels: " << c["levels_chosen"].get<std::string>()
     << ".\n\n| loss | tokens A | tokens B | B/A |\n|---|---|---|---|\n";
  for (const auto& l : c["levels"]) {
    const auto cell = [](const json& v, int digits) {
      return v.is_null() ? std::string("not reached") : md_number(v, digits);
    };
    md << "| " << md_number(l["loss"], 3) << " | " << cell(l["tokens_a"], 0) << " | " << cell(l["tokens_b"], 0) << " | "
       << (l["ratio"].is_null() ? std::string("-") : md_number(l["ratio"], 2) + "x") << " |\n";
  }
  const auto last = [](const json& side, const char* key) {
    return side[key].empty() ? std::string("-") : md_number(side[key].back(), 4);
  };
  md << "\nFinal training loss A " << last(c["a"], "loss") << ", B " << last(c["b"], "loss")
     << "; final validation loss A " << last(c["a"], "valid_loss") << ", B " << last(c["b"], "valid_loss") << ".\n";
  if (r.contains("seeds")) md << seeds_markdown(r["seeds"]);
  if (r.contains("evaluation")) {
    const json& e = r["evaluation"];
    md << "\n## Evaluation\n\n"
       << e["method"].get<std::string>() << "; " << e["resamples"].get<int64_t>() << " resamples, seed "
       << e["seed"].get<uint64_t>() << " (" << e["rng"].get<std::string>()
       << "). Values in points (x100).\n\n| task | metric | n | A | B | B - A | 95% interval | p | significant (Holm) "
          "|\n"
       << "|---|---|---|---|---|---|---|---|---|\n";
    const auto pts = [](const json& v) { return md_number(100 * v.get<double>(), 1); };
    for (const auto& t : e["tasks"]) {
      char p[32];
      std::snprintf(p, sizeof(p), "%.3g", t["p"].get<double>());
      md << "| " << t["task"].get<std::string>() << " | " << t["metric"].get<std::string>() << " | "
         << t["n"].get<int64_t>() << " | " << pts(t["a"]) << " | " << pts(t["b"]) << " | "
         << (t["diff"].get<double>() >= 0 ? "+" : "") << pts(t["diff"]) << " | [" << pts(t["low"]) << ", "
         << pts(t["high"]) << "] | " << p << " (" << t["test"].get<std::string>() << ") | "
         << (t["significant"].get<bool>() ? "yes" : "no") << " |\n";
    }
    const json& m = e["macro"];
    md << "| **macro** | | | " << pts(m["a"]) << " | " << pts(m["b"]) << " | "
       << (m["diff"].get<double>() >= 0 ? "+" : "") << pts(m["diff"]) << " | [" << pts(m["low"]) << ", "
       << pts(m["high"]) << "] | | |\n";
    if (!e["dropped"].empty()) md << "\nDropped by --intersect: " << e["dropped"].dump() << "\n";
    std::string needed;
    for (const auto& t : e["tasks"]) {
      if (!t.contains("seeds_needed") || t["seeds_needed"].is_null()) continue;
      std::string counts;
      for (const auto& n : t["seeds_needed"]["rows"])
        counts += (counts.empty() ? "" : " / ") +
                  (n["seeds_per_arm"].is_null() ? std::string("-") : n["seeds_per_arm"].dump());
      needed += "| " + t["task"].get<std::string>() + " | " +
                md_number(100 * t["seeds_needed"]["sd"].get<double>(), 2) + " | " + counts + " |\n";
    }
    if (!needed.empty())
      md << "\nSeeds per arm to detect 1 / 2 points (the rule of the Seeds section; seed sd of the task's run means, "
            "in points):\n\n| task | seed sd | seeds per arm |\n|---|---|---|\n"
         << needed;
    if (e.contains("suite")) md << suite_markdown(e["suite"]);
  }
  return md.str();
}

}  // namespace archspace
