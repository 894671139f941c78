#include "archspace/eval/generation_metrics.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "archspace/eval/generation_task_family.h"
#include "archspace/eval/task_groups.h"
#include "archspace/util/error.h"
#include "archspace/util/json_file.h"
#include "archspace/util/json_lines.h"

namespace archspace {

// ---- the registry: every family's tasks (eval/generation_task_family.h, src/eval/tasks/) -----------------------

namespace {

const std::vector<GenerationTaskSpec>& registry() {
  static const std::vector<GenerationTaskSpec> specs = [] {
    std::vector<GenerationTaskSpec> v;
    for (const GenerationTaskFamily* family : generation_task_families()) {
      for (GenerationTaskSpec spec : family->tasks()) {
        spec.family = family;
        v.push_back(std::move(spec));
      }
    }
    return v;
  }();
  return specs;
}

const GenerationTaskSpec& known_task(const std::string& task) {
  const GenerationTaskSpec* spec = find_generation_task(task);
  if (!spec) throw Error("unknown generation task \"" + task + "\"");
  return *spec;
}

}  // namespace

const GenerationTaskSpec* find_generation_task(const std::string& task) {
  for (const auto& s : registry()) {
    if (s.task == task) return &s;
  }
  return nullptr;
}

std::vector<std::string> generation_task_names() {
  std::vector<std::string> names;
  for (const auto& s : registry()) names.push_back(s.task);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::pair<std::string, std::vector<std::string>>> generation_groups() {
  // The task-group registry's groups of generation tasks (eval/task_groups.h holds every group once).
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const TaskGroup& g : task_groups()) {
    if (!g.members.empty() && find_generation_task(g.members.front())) groups.emplace_back(g.name, g.members);
  }
  return groups;
}

void check_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) { spec.family->check_gold(spec, gold); }

nlohmann::json gold_from_request(const GenerationTaskSpec& spec, const nlohmann::json& request_line) {
  return spec.family->gold_from_request(spec, request_line);
}

bool runs_programs(const std::string& task) {
  const GenerationTaskSpec* spec = find_generation_task(task);
  return spec && spec->family->runs_programs();
}

std::vector<InstanceMetrics> score_generations(const std::vector<GenerationInstance>& instances,
                                               const AnswerEquivalence& equivalence,
                                               const InstructionCheck& instructions, const CodeExecutor& execute) {
  std::vector<InstanceMetrics> out(instances.size());
  // Each family scores all its instances at once (the external checks are then called once each), in registry order.
  std::map<const GenerationTaskFamily*,
           std::pair<std::vector<const GenerationInstance*>, std::vector<InstanceMetrics*>>>
      batches;
  for (size_t i = 0; i < instances.size(); ++i) {
    const GenerationTaskSpec& spec = known_task(instances[i].task);
    for (const auto& name : spec.metrics) out[i].values.push_back({name, 0.0});
    auto& batch = batches[spec.family];
    batch.first.push_back(&instances[i]);
    batch.second.push_back(&out[i]);
  }
  const ExternalScorers scorers{equivalence, instructions, execute};
  for (const GenerationTaskFamily* family : generation_task_families()) {
    const auto it = batches.find(family);
    if (it != batches.end()) family->score(it->second.first, scorers, it->second.second);
  }
  return out;
}

std::vector<TaskResult> generation_results(const std::vector<GenerationInstance>& instances,
                                           const std::vector<InstanceMetrics>& metrics,
                                           const std::vector<std::pair<std::string, int64_t>>& shots,
                                           std::vector<std::pair<std::string, std::vector<std::string>>>* macro_over) {
  if (metrics.size() != instances.size()) throw Error("generation_results: one metrics entry per instance expected");
  std::vector<std::string> order;
  std::map<std::string, std::vector<size_t>> by_task;
  for (size_t i = 0; i < instances.size(); ++i) {
    if (!by_task.count(instances[i].task)) order.push_back(instances[i].task);
    by_task[instances[i].task].push_back(i);
  }
  std::vector<TaskResult> results;
  std::map<std::string, const TaskResult*> done;
  for (const auto& task : order) {
    const GenerationTaskSpec* spec = find_generation_task(task);
    TaskResult r;
    r.task = task;
    r.format = "gen";
    r.shots = -1;
    for (const auto& [t, n] : shots) {
      if (t == task) r.shots = n;
    }
    r.documents = static_cast<int64_t>(by_task[task].size());
    r.primary_metric = spec->primary_metric;
    std::vector<const GenerationInstance*> task_instances;
    for (size_t i : by_task[task]) task_instances.push_back(&instances[i]);
    for (const auto& name : spec->metrics) {
      std::vector<double> xs;
      for (size_t i : by_task[task]) xs.push_back(metric_value(metrics[i], name));
      MetricValue v = spec->family->aggregate(name, task_instances, xs);
      v.primary = name == spec->primary_metric;
      r.metrics.push_back(v);
    }
    results.push_back(std::move(r));
  }
  for (const auto& r : results) done[r.task] = &r;
  if (macro_over) macro_over->clear();
  std::vector<TaskResult> groups;
  for (const auto& [group, members] : generation_groups()) {
    const bool micro = find_task_group(group)->primary_aggregate == "micro";
    std::vector<const TaskResult*> present;
    std::vector<std::string> names;
    for (const auto& m : members) {
      if (done.count(m)) {
        present.push_back(done[m]);
        names.push_back(m);
      }
    }
    if (present.empty()) continue;
    TaskResult g;
    g.task = group;
    g.format = "gen";
    g.shots = present[0]->shots;
    for (const auto* p : present) {
      if (p->shots != g.shots) g.shots = -1;
      g.documents += p->documents;
    }
    g.primary_metric = present[0]->primary_metric;
    g.members = static_cast<int64_t>(present.size());  // a group row, as eval/task_groups.h marks them
    for (size_t m = 0; m < present[0]->metrics.size(); ++m) {
      MetricValue v;
      v.name = present[0]->metrics[m].name;
      v.primary = present[0]->metrics[m].primary;
      v.aggregate = "macro";
      double var = 0;
      for (const auto* p : present) {
        v.value += p->metrics[m].value;
        var += p->metrics[m].stderr_ * p->metrics[m].stderr_;
      }
      const auto k = static_cast<double>(present.size());
      v.value /= k;
      v.stderr_ = std::sqrt(var) / k;
      if (micro) {
        // Every member document pooled, the group's primary (OLMES' suite primary_metric "micro").
        std::vector<double> pooled;
        for (const auto& name : names) {
          for (size_t i : by_task[name]) pooled.push_back(metric_value(metrics[i], v.name));
        }
        MetricValue p = mean_with_stderr(v.name, pooled);
        p.primary = v.primary;
        p.aggregate = "micro";
        v.primary = false;
        g.metrics.push_back(p);
      }
      g.metrics.push_back(v);
    }
    groups.push_back(std::move(g));
    if (macro_over) macro_over->push_back({group, names});
  }
  results.insert(results.end(), groups.begin(), groups.end());
  return results;
}

nlohmann::json metrics_json(const InstanceMetrics& metrics) {
  nlohmann::json m = nlohmann::json::object();
  for (const auto& [name, value] : metrics.values) m[name] = value;
  return m;
}

nlohmann::json generation_row(const GenerationInstance& instance, int64_t shots,
                              const std::vector<int64_t>& prompt_tokens, const InstanceMetrics& metrics) {
  nlohmann::json row = {{"task", instance.task},
                        {"format", "gen"},
                        {"shots", shots},
                        {"doc_id", instance.doc_id},
                        {"native_id", instance.native_id},
                        {"prompt_tokens", prompt_tokens},
                        {"generation", instance.generation},
                        {"gold", instance.gold},
                        {"metrics", metrics_json(metrics)}};
  if (!metrics.scoring_errors.empty()) row["scoring_errors"] = metrics.scoring_errors;
  return row;
}

RescoreFile read_rescore_file(const std::string& path) {
  RescoreFile f;
  std::map<std::pair<std::string, std::string>, std::string> seen;  // (task, doc_id) -> where
  std::map<std::string, std::pair<int64_t, std::string>> shots;     // task -> (shots, where)
  std::vector<std::string> shot_order;
  for_each_json_line(path, [&](const nlohmann::json& row, const std::string& where) {
    if (!row.is_object()) throw Error(where + ": a row must be a JSON object");
    f.rows.push_back(row);
    if (!row.contains("generation") && row.contains("loglikelihood")) {
      ++f.loglikelihood_rows;
      return;
    }
    for (const char* key : {"task", "doc_id", "generation", "gold"}) {
      if (!row.contains(key)) throw Error(where + ": missing field \"" + key + "\"");
    }
    if (!row["task"].is_string()) throw Error(where + ": field \"task\" must be a string");
    if (!row["generation"].is_string()) throw Error(where + ": field \"generation\" must be a string");
    if (!row["doc_id"].is_number_integer() && !row["doc_id"].is_string())
      throw Error(where + ": field \"doc_id\" must be an integer or a string");
    GenerationInstance x;
    x.task = row["task"].get<std::string>();
    const GenerationTaskSpec* spec = find_generation_task(x.task);
    if (!spec) {
      std::string known;
      for (const auto& t : generation_task_names()) known += (known.empty() ? "" : ", ") + t;
      throw Error(where + ": field \"task\": unknown generation task \"" + x.task + "\" (known: " + known + ")");
    }
    if (row.contains("format") && row["format"] != "gen")
      throw Error(where + ": field \"format\" must be \"gen\" in a generation row");
    try {
      check_gold(*spec, row["gold"]);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
    if (row.contains("shots")) {
      if (!row["shots"].is_number_integer() || row["shots"].get<int64_t>() < 0)
        throw Error(where + ": field \"shots\" must be a non-negative integer");
      const int64_t n = row["shots"].get<int64_t>();
      auto it = shots.find(x.task);
      if (it == shots.end()) {
        shots[x.task] = {n, where};
        shot_order.push_back(x.task);
      } else if (it->second.first != n) {
        throw Error(where + ": field \"shots\": " + std::to_string(n) + " for task " + x.task + ", which has " +
                    std::to_string(it->second.first) + " at " + it->second.second);
      }
    }
    x.doc_id = row["doc_id"];
    x.native_id = row.contains("native_id") ? row["native_id"] : nlohmann::json();
    x.generation = row["generation"].get<std::string>();
    x.gold = row["gold"];
    const auto key = std::make_pair(x.task, x.doc_id.dump());
    if (auto it = seen.find(key); it != seen.end())
      throw Error(where + ": field \"doc_id\": document " + x.doc_id.dump() + " of task " + x.task + " is already at " +
                  it->second);
    seen[key] = where;
    f.instance_rows.push_back(f.rows.size() - 1);
    f.instances.push_back(std::move(x));
  });
  for (const auto& t : shot_order) f.shots.push_back({t, shots[t].first});
  return f;
}

std::vector<nlohmann::json> rescored_rows(const RescoreFile& file, const std::vector<InstanceMetrics>& metrics) {
  if (metrics.size() != file.instances.size())
    throw Error("rescored_rows: " + std::to_string(metrics.size()) + " metrics for " +
                std::to_string(file.instances.size()) + " instances");
  std::vector<nlohmann::json> rows = file.rows;
  for (size_t i = 0; i < file.instances.size(); ++i) {
    nlohmann::json& row = rows[file.instance_rows[i]];
    row["metrics"] = metrics_json(metrics[i]);
    row.erase("scoring_errors");  // an earlier scoring's, replaced by this one's
    if (!metrics[i].scoring_errors.empty()) row["scoring_errors"] = metrics[i].scoring_errors;
  }
  return rows;
}

}  // namespace archspace
