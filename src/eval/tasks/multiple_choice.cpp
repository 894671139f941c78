// The generic multiple-choice family: every task no other multiple-choice family has (arc_*, hellaswag, piqa, ...
// as OLMES' request files give them). Its few-shot prompts are "Question: ...\nAnswer: ..." blocks, rendered as
// OLMES' <task>:mc::tulu configs do (fewshot_as_multiturn, no assistant prefix); its metrics the generic ranked
// accuracies (eval/downstream.h: task_metrics). The defaults of MultipleChoiceTaskFamily live here too.
#include "archspace/eval/task_family_registration.h"
#include "archspace/util/error.h"

namespace archspace {

FewShotMarkers MultipleChoiceTaskFamily::few_shot_markers(const std::string&) const {
  return {"Question:", "\nAnswer:"};
}

ChatSettings MultipleChoiceTaskFamily::chat_settings(const std::string&) const { return {}; }

std::optional<TaskResult> MultipleChoiceTaskFamily::metrics(const TaskFiles&, const TaskResult&) const {
  return std::nullopt;
}

std::shared_ptr<DocumentLabels> MultipleChoiceTaskFamily::read_document_labels(const nlohmann::json&,
                                                                               const std::string&) const {
  return nullptr;
}

double MultipleChoiceTaskFamily::document_metric(const std::string& metric, const nlohmann::json&,
                                                 const std::map<int64_t, double>&) const {
  throw Error("metric \"" + metric + "\" is not scored from a document's own labels");
}

namespace task_families {
namespace {

class MultipleChoice final : public MultipleChoiceTaskFamily {
 public:
  bool has_task(const std::string&) const override { return true; }
  bool takes_every_task() const override { return true; }
};

}  // namespace

ARCHSPACE_MULTIPLE_CHOICE_TASK_FAMILY(multiple_choice, MultipleChoice, 90)

}  // namespace task_families
}  // namespace archspace
