// Evaluation suites: a named table of tasks with OLMES' settings, run by one command (`eval downstream --suite
// NAME`) and reported as one table of per-task primary metrics with their macro average, as OLMES' suites are.
//
// olmo3-sft: the seed's result table of the SFT models (eight tasks, chat format, greedy):
//   bbh           3-shot CoT, exact match after "So the answer is" (the group's micro over its 27 subtasks)
//   drop          3-shot, F1
//   gsm8k         8-shot CoT, exact match on the last number
//   ifeval        0-shot, prompt-level loose accuracy
//   minerva_math  4-shot, exact match, macro over the 7 subjects
//   mmlu          5-shot from dev, multiple choice (lettered), acc_raw, macro over the 57 subjects
//   popqa         15-shot, exact match on any alias
//   truthfulqa    6-shot primer, MC2
// A task is evaluated from the request files found (the user's --tasks-dir first, then the built-in ones),
// whatever their shot count; the table shows the files' shots beside OLMES'. A task (or a group member) with no
// files is listed as missing, in the table and the JSON, and the macro says over which tasks it was taken.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "archspace/eval/downstream.h"

namespace archspace {

struct SuiteTask {
  std::string name;    // a task or a task group (eval/task_groups.h)
  std::string kind;    // "gen" (generation, eval/generation_tasks.h) or a multiple-choice format ("mc", "rc")
  std::string metric;  // the table's metric (the task's primary; a group's at its primary aggregate)
  int64_t shots = 0;   // OLMES' setting (multiple-choice files are looked for with it)
};

struct Suite {
  std::string name, description;
  bool chat = false;  // prompts in the chat format (eval/chat_format.h)
  std::vector<SuiteTask> tasks;
};

const Suite* find_suite(const std::string& name);
std::vector<std::string> suite_names();

// What of a suite can run from `dirs`: per task, its files, or why it is missing.
struct SuitePlan {
  struct Entry {
    SuiteTask task;
    std::vector<std::string> members;  // the tasks run (a group's members; the task itself)
    std::string missing;               // non-empty: why the task cannot run (no files for ...), every name
    std::string missing_brief;         // the same with a long list of names shortened (the table's cell)
  };
  const Suite* suite = nullptr;
  std::vector<Entry> entries;
};
SuitePlan plan_suite(const Suite& suite, const std::vector<std::string>& dirs);

// The suite's table from the evaluated rows (tasks and the groups' rows).
struct SuiteReport {
  struct Row {
    std::string task, metric;
    std::optional<double> value;  // unset: missing
    double stderr_ = 0;
    int64_t shots = -1, olmes_shots = 0, documents = 0;
    std::string missing, missing_brief;  // the JSON's (every name) and the table's (a long list shortened)
    std::string prompts_differ;          // how the prompts differ from OLMES' spec (empty: they do not)
  };
  std::string name;
  std::vector<Row> rows;
  std::vector<std::string> tasks, missing, macro_over;
  std::optional<double> macro;  // the mean of the present tasks' values; unset when none ran
};
// prompts_differ: per task, how its prompts differ from the suite's OLMES spec (a line under the table, a field of
// the JSON row).
SuiteReport suite_report(const SuitePlan& plan, const std::vector<TaskResult>& results,
                         const std::map<std::string, std::string>& prompts_differ = {});

// The table printed after the per-task rows: task, metric, value (x100), shots (OLMES'), n; then the macro line,
// and a line per task whose prompts differ from OLMES' spec.
// One line per row, whatever its length: a missing group lists its first member tasks and "(+K more)".
std::string suite_table(const SuiteReport& report);

// The --out file's "suite" object: {"name", "tasks", "missing", "macro", "macro_over", "rows": [...]}; a row whose
// prompts differ from OLMES' spec has "prompts_differ".
nlohmann::json suite_json(const SuiteReport& report);

}  // namespace archspace
