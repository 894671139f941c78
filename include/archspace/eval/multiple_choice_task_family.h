// A family of multiple-choice (ranked-classification) tasks as one registered definition, the multiple-choice side
// of eval/generation_task_family.h: each family lives in one file of src/eval/tasks/ and says which tasks it has
// (by name), how their few-shot prompts split into chat turns, which task groups it defines, and, where its
// documents need their own metrics, how it scores them. The generic code (eval/chat_format.h, eval/task_groups.h,
// eval/downstream.h: task_metrics) reaches a task only through its family: no task names outside the family's file.
//
// A new family: one file in src/eval/tasks/ defining a MultipleChoiceTaskFamily, its accessor declared in
// src/eval/tasks/families.h, and one line in the list of src/eval/tasks/registry.cpp (before the generic one).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "archspace/eval/chat_format.h"
#include "archspace/eval/downstream.h"
#include "archspace/eval/task_groups.h"

namespace archspace {

class MultipleChoiceTaskFamily {
 public:
  virtual ~MultipleChoiceTaskFamily() = default;

  // True for the tasks the family defines (the generic family, registered last, takes every task).
  virtual bool has_task(const std::string& task) const = 0;

  // How the task's few-shot prompts split into chat turns (eval/chat_format.h); by default "Question:" and
  // "\nAnswer:".
  virtual FewShotMarkers few_shot_markers(const std::string& task) const;

  // How OLMES' instruct config renders the task's few-shot prompt in the chat format; by default
  // fewshot_as_multiturn, no assistant prefix (mmlu:mc::tulu, olmes oe_eval/configs/tasks.py:4999).
  virtual ChatSettings chat_settings(const std::string& task) const;

  // The task groups the family defines (eval/task_groups.h), in report order.
  virtual std::vector<TaskGroup> groups() const { return {}; }

  // The task's metrics when the family scores these files itself, `result` holding the request scores; nullopt:
  // not the family's. Chosen by what the documents carry (TruthfulQA's labels), not by name: task_metrics asks
  // every family in registration order and the first answer counts; none answers: the generic ranked accuracies.
  virtual std::optional<TaskResult> metrics(const TaskFiles& files, const TaskResult& result) const;
};

// The registry: every family once, in registration order, the generic one last.
const std::vector<const MultipleChoiceTaskFamily*>& multiple_choice_task_families();

// The first registered family that has `task` (the generic one when no other does).
const MultipleChoiceTaskFamily& multiple_choice_task_family(const std::string& task);

}  // namespace archspace
