// A family of multiple-choice (ranked-classification) tasks as one registered definition, the multiple-choice side
// of eval/generation_task_family.h: each family lives in one file of src/eval/tasks/ and says which tasks it has
// (by name), how their few-shot prompts split into chat turns, which task groups it defines, and, where its
// documents carry their own labels, how it reads them and scores them. The generic code (eval/task_files.h: load_task,
// eval/chat_format.h, eval/task_groups.h, eval/downstream.h: task_metrics, eval/compare.h) reaches a task only
// through its family: no task names and no document formats outside the family's file.
//
// A new family: one file in src/eval/tasks/ defining a MultipleChoiceTaskFamily and registering it
// (eval/task_family_registration.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
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

  // True for the tasks the family defines.
  virtual bool has_task(const std::string& task) const = 0;

  // True for the generic family, which has every task: the registry asks it after the others.
  virtual bool takes_every_task() const { return false; }

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

  // One document's own labels, read by load_task from the `doc` object of the document's first request line
  // (`where` names that line; errors name the field); null, the default: the document has none, and its requests'
  // `label` is the gold.
  virtual std::shared_ptr<DocumentLabels> read_document_labels(const nlohmann::json& doc,
                                                               const std::string& where) const;

  // Where the family's labels go: the requests-out rows' field holding DocumentLabels::to_json ("" for none), and
  // the metrics scored from them, so that `archspace compare` scores each document from its rows as `eval
  // downstream` does (document_metric: `labels` that field's value, `ll` the document's log-likelihoods by idx;
  // throws when they do not fit).
  virtual std::string document_labels_field() const { return ""; }
  virtual std::vector<std::string> document_metrics() const { return {}; }
  virtual double document_metric(const std::string& metric, const nlohmann::json& labels,
                                 const std::map<int64_t, double>& ll) const;
};

// The registry: every family once, by the order its registration states, the generic one last.
const std::vector<const MultipleChoiceTaskFamily*>& multiple_choice_task_families();

// The family that has `task` (the generic one when no other does).
const MultipleChoiceTaskFamily& multiple_choice_task_family(const std::string& task);

}  // namespace archspace
