// The generic multiple-choice family: every task no other multiple-choice family has (arc_*, hellaswag, piqa, ...
// as OLMES' request files give them). Its few-shot prompts are "Question: ...\nAnswer: ..." blocks, rendered as
// OLMES' <task>:mc::tulu configs do (fewshot_as_multiturn, no assistant prefix); its metrics the generic ranked
// accuracies (eval/downstream.h: task_metrics). The defaults of MultipleChoiceTaskFamily live here too.
#include "families.h"

namespace archspace {

FewShotMarkers MultipleChoiceTaskFamily::few_shot_markers(const std::string&) const {
  return {"Question:", "\nAnswer:"};
}

ChatSettings MultipleChoiceTaskFamily::chat_settings(const std::string&) const { return {}; }

std::optional<TaskResult> MultipleChoiceTaskFamily::metrics(const TaskFiles&, const TaskResult&) const {
  return std::nullopt;
}

namespace task_families {
namespace {

class MultipleChoice final : public MultipleChoiceTaskFamily {
 public:
  bool has_task(const std::string&) const override { return true; }
};

}  // namespace

const MultipleChoiceTaskFamily& multiple_choice() {
  static const MultipleChoice family;
  return family;
}

}  // namespace task_families
}  // namespace archspace
