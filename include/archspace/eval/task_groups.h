// Task groups: a name that stands for a fixed list of member tasks, as OLMES' task suites do (mmlu: the 57
// mmlu_<subject> tasks; minerva_math: its seven subjects; bbh: the 27 bbh_<subtask> tasks). `--tasks mmlu` evaluates
// every member and adds the group's rows after them:
//   macro  the plain mean over the members of each metric they all have (OLMES' suite primary_metric "macro",
//          the group's primary: the members' primary metric), stderr sqrt(sum of the members' stderr^2) / k
//          (lm-eval's unweighted_mean_stderr: the k member means are independent)
//   micro  each of those metrics over all members' documents pooled (each document weighs the same; lm-eval's
//          mmlu group, weight_by_size; OLMES reports both, <metric>_macro and <metric>_micro), stderr that of
//          the pooled documents, sqrt(sample variance / N), exact from the members' means, stderrs and sizes
// A group row's n is the documents of all its members, its `members` the number of member tasks.
#pragma once

#include <string>
#include <vector>

#include "archspace/eval/downstream.h"

namespace archspace {

struct TaskGroup {
  std::string name;
  std::vector<std::string> members;         // task directory names, in report order
  std::string primary_aggregate = "macro";  // OLMES' suite primary_metric: "macro", or "micro" (bbh)
  std::string missing_hint;                 // appended to the error for members without files (how to make them)
};

// Every group the engine knows, by name: those the task families define (each family's own file in
// src/eval/tasks/), the multiple-choice families' first, then the generation families', in registration order.
const std::vector<TaskGroup>& task_groups();

// The group of that name, or nullptr.
const TaskGroup* find_task_group(const std::string& name);

// `names` with each group replaced by its members (later duplicates dropped). Throws, before any work, for a
// name that is neither a group nor a task in `dirs` (listing the groups and tasks) and for a group some of
// whose members have no files there (naming them and where it looked).
std::vector<std::string> expand_task_groups(const std::vector<std::string>& dirs,
                                            const std::vector<std::string>& names);

// `results` with, after the last member of each group among `names`, one row per format and shot count that
// every member ran in (members have metrics and aggregate set; see the top of this file). A group with
// members missing in a format gets no row for it and a line in `notes`.
std::vector<TaskResult> with_group_results(const std::vector<std::string>& names,
                                           const std::vector<TaskResult>& results,
                                           std::vector<std::string>* notes = nullptr);

}  // namespace archspace
