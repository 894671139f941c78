#include "archspace/eval/suites.h"

#include "archspace/eval/generation_tasks.h"
#include "archspace/eval/task_files.h"
#include "archspace/eval/task_groups.h"
#include "archspace/util/error.h"
#include "archspace/util/strings.h"

namespace archspace {

namespace {

const std::vector<Suite>& suites() {
  // OLMES' instruct settings of the seed's table (issue 21 lists them; OLMo 3's SFT evaluation).
  static const std::vector<Suite> all = {
      {"olmo3-sft",
       "the seed's eight-task table of the SFT models (OLMES instruct settings, chat format, greedy)",
       true,
       {{"bbh", "gen", "exact_match", 3},
        {"drop", "gen", "f1", 3},
        {"gsm8k", "gen", "exact_match", 8},
        {"ifeval", "gen", "prompt_level_loose_acc", 0},
        {"minerva_math", "gen", "exact_match", 4},
        {"mmlu", "mc", "acc_raw", 5},
        {"popqa", "gen", "exact_match", 15},
        {"truthfulqa", "rc", "mc2", 6}}},
  };
  return all;
}

// A missing group's member tasks named in the table (BBH has 27); the JSON names them all.
constexpr size_t kMissingShown = 3;

// Why `task` of that kind has no files in `dirs` (empty when it has).
std::string why_missing(const std::vector<std::string>& dirs, const std::string& task, const SuiteTask& t) {
  try {
    if (t.kind == "gen") {
      if (!is_generation_task(task)) return task + " is not a generation task the engine scores";
      find_generation_variant(dirs, task);
    } else {
      find_task_variant(dirs, task, t.kind, t.shots);
    }
    return "";
  } catch (const Error&) {
    return task;
  }
}

}  // namespace

const Suite* find_suite(const std::string& name) {
  for (const auto& s : suites()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::vector<std::string> suite_names() {
  std::vector<std::string> names;
  for (const auto& s : suites()) names.push_back(s.name);
  return names;
}

SuitePlan plan_suite(const Suite& suite, const std::vector<std::string>& dirs) {
  SuitePlan plan;
  plan.suite = &suite;
  for (const auto& t : suite.tasks) {
    SuitePlan::Entry e;
    e.task = t;
    const TaskGroup* group = find_task_group(t.name);
    e.members = group ? group->members : std::vector<std::string>{t.name};
    std::vector<std::string> missing;
    for (const auto& m : e.members) {
      const std::string why = why_missing(dirs, m, t);
      if (!why.empty()) missing.push_back(why);
    }
    if (!missing.empty()) {
      const std::string files = t.kind == "gen" ? "generation request files" : t.kind + " request files";
      const std::string why =
          group ? std::to_string(missing.size()) + " of its " + std::to_string(e.members.size()) + " tasks have no " +
                      files + ": "
                : "no " + files + (t.kind == "gen" ? "" : " with " + std::to_string(t.shots) + " shots");
      e.missing = group ? why + join(missing) : why;
      e.missing_brief = group ? why + join_brief(missing, kMissingShown) : why;
      e.members.clear();
    }
    plan.entries.push_back(std::move(e));
  }
  return plan;
}

SuiteReport suite_report(const SuitePlan& plan, const std::vector<TaskResult>& results,
                         const std::map<std::string, std::string>& prompts_differ) {
  SuiteReport report;
  report.name = plan.suite->name;
  double sum = 0;
  for (const auto& e : plan.entries) {
    SuiteReport::Row row;
    row.task = e.task.name;
    row.metric = e.task.metric;
    row.olmes_shots = e.task.shots;
    if (const auto it = prompts_differ.find(e.task.name); it != prompts_differ.end()) row.prompts_differ = it->second;
    report.tasks.push_back(e.task.name);
    if (!e.missing.empty()) {
      row.missing = e.missing;
      row.missing_brief = e.missing_brief;
      report.missing.push_back(e.task.name);
      report.rows.push_back(row);
      continue;
    }
    const TaskGroup* task_group = find_task_group(e.task.name);
    const bool group = task_group != nullptr;
    const std::string format = e.task.kind;
    const TaskResult* found = nullptr;
    for (const auto& r : results) {
      if (r.task == e.task.name && r.format == format && (r.members > 0) == group) found = &r;
    }
    const MetricValue* value = nullptr;
    if (found) {
      for (const auto& m : found->metrics) {
        // A group's value is its primary aggregate (OLMES' suite: macro, bbh micro).
        if (m.name == e.task.metric && (!group || m.aggregate == task_group->primary_aggregate)) value = &m;
      }
    }
    if (!value)
      throw Error("suite " + report.name + ": no " + e.task.metric + " result for " + e.task.name + " (" + format +
                  ") among the evaluated rows");
    row.value = value->value;
    row.stderr_ = value->stderr_;
    row.shots = found->shots;
    row.documents = found->documents;
    sum += value->value;
    report.macro_over.push_back(e.task.name);
    report.rows.push_back(row);
  }
  if (!report.macro_over.empty()) report.macro = sum / static_cast<double>(report.macro_over.size());
  return report;
}

std::string suite_table(const SuiteReport& report) {
  std::string out = "\nsuite " + report.name + " (values x 100)\n";
  out += format_string("%-14s %-24s %15s %5s %5s %6s\n", "task", "metric", "value +- stderr", "shots", "olmes", "n");
  for (const auto& r : report.rows) {
    if (!r.value) {
      out += format_string("%-14s %-24s %15s %5s %5lld %6s  missing: %s\n", r.task.c_str(), r.metric.c_str(), "-", "-",
                           static_cast<long long>(r.olmes_shots), "-", r.missing_brief.c_str());
    } else {
      const std::string v = format_string("%.1f +- %.1f", 100 * *r.value, 100 * r.stderr_);
      out += format_string("%-14s %-24s %15s %5s %5lld %6lld\n", r.task.c_str(), r.metric.c_str(), v.c_str(),
                           r.shots >= 0 ? std::to_string(r.shots).c_str() : "-", static_cast<long long>(r.olmes_shots),
                           static_cast<long long>(r.documents));
    }
  }
  if (report.macro) {
    out += format_string("%-14s %-24s %15.1f  over %zu of %zu tasks%s%s\n", "macro", "mean of the above",
                         100 * *report.macro, report.macro_over.size(), report.tasks.size(),
                         report.missing.empty() ? "" : "; missing: ", join(report.missing).c_str());
  } else {
    out += format_string("%-14s %-24s %15s  no task of the suite had files\n", "macro", "-", "-");
  }
  for (const auto& r : report.rows) {
    if (!r.prompts_differ.empty()) out += r.task + ": " + r.prompts_differ + "\n";
  }
  return out;
}

nlohmann::json suite_json(const SuiteReport& report) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : report.rows) {
    nlohmann::json row = {{"task", r.task}, {"metric", r.metric}, {"olmes_shots", r.olmes_shots}};
    if (r.value) {
      row["value"] = *r.value;
      row["stderr"] = r.stderr_;
      row["shots"] = r.shots >= 0 ? nlohmann::json(r.shots) : nlohmann::json();
      row["n"] = r.documents;
    } else {
      row["missing"] = r.missing;
    }
    if (!r.prompts_differ.empty()) row["prompts_differ"] = r.prompts_differ;
    rows.push_back(row);
  }
  return {{"name", report.name},
          {"tasks", report.tasks},
          {"missing", report.missing},
          {"macro", report.macro ? nlohmann::json(*report.macro) : nlohmann::json()},
          {"macro_over", report.macro_over},
          {"rows", rows}};
}

}  // namespace archspace
