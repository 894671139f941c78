// mmlu_<subject> (the 57 of OLMES' MMLU_SUBJECTS, hails/mmlu_no_train and cais/mmlu; the group mmlu), rendered by
// scripts/render_tasks.py as OLMES' mmlu_<subject>:mc::olmes and :rc::olmes: the generic multiple-choice prompts
// ("Question:" / "\nAnswer:", after the subject's description) and metrics.
#include "archspace/eval/task_family_registration.h"

namespace archspace::task_families {
namespace {

std::vector<std::string> subject_tasks() {
  std::vector<std::string> v;
  for (const char* subject : {"abstract_algebra",
                              "anatomy",
                              "astronomy",
                              "business_ethics",
                              "clinical_knowledge",
                              "college_biology",
                              "college_chemistry",
                              "college_computer_science",
                              "college_mathematics",
                              "college_medicine",
                              "college_physics",
                              "computer_security",
                              "conceptual_physics",
                              "econometrics",
                              "electrical_engineering",
                              "elementary_mathematics",
                              "formal_logic",
                              "global_facts",
                              "high_school_biology",
                              "high_school_chemistry",
                              "high_school_computer_science",
                              "high_school_european_history",
                              "high_school_geography",
                              "high_school_government_and_politics",
                              "high_school_macroeconomics",
                              "high_school_mathematics",
                              "high_school_microeconomics",
                              "high_school_physics",
                              "high_school_psychology",
                              "high_school_statistics",
                              "high_school_us_history",
                              "high_school_world_history",
                              "human_aging",
                              "human_sexuality",
                              "international_law",
                              "jurisprudence",
                              "logical_fallacies",
                              "machine_learning",
                              "management",
                              "marketing",
                              "medical_genetics",
                              "miscellaneous",
                              "moral_disputes",
                              "moral_scenarios",
                              "nutrition",
                              "philosophy",
                              "prehistory",
                              "professional_accounting",
                              "professional_law",
                              "professional_medicine",
                              "professional_psychology",
                              "public_relations",
                              "security_studies",
                              "sociology",
                              "us_foreign_policy",
                              "virology",
                              "world_religions"})
    v.push_back(std::string("mmlu_") + subject);
  return v;
}

class Mmlu final : public MultipleChoiceTaskFamily {
 public:
  bool has_task(const std::string& task) const override { return task.starts_with("mmlu_"); }
  // The wheels do not ship MMLU's task files: scripts/render_tasks.py writes them.
  std::vector<TaskGroup> groups() const override {
    return {{"mmlu", subject_tasks(), "macro", " (run scripts/render_tasks.py)"}};
  }
};

}  // namespace

ARCHSPACE_MULTIPLE_CHOICE_TASK_FAMILY(mmlu, Mmlu, 20)

}  // namespace archspace::task_families
