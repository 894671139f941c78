// The lists of task families: a new family is one file in this folder and one line here.
#include "families.h"

namespace archspace {

const std::vector<const GenerationTaskFamily*>& generation_task_families() {
  static const std::vector<const GenerationTaskFamily*> families = {
      &task_families::gsm8k(),  &task_families::minerva_math(), &task_families::drop(),  &task_families::qa(),
      &task_families::ifeval(), &task_families::bbh(),          &task_families::popqa(), &task_families::code(),
  };
  return families;
}

const std::vector<const MultipleChoiceTaskFamily*>& multiple_choice_task_families() {
  // The generic family last: it has every task.
  static const std::vector<const MultipleChoiceTaskFamily*> families = {
      &task_families::truthfulqa(),
      &task_families::mmlu(),
      &task_families::multiple_choice(),
  };
  return families;
}

const MultipleChoiceTaskFamily& multiple_choice_task_family(const std::string& task) {
  for (const auto* f : multiple_choice_task_families()) {
    if (f->has_task(task)) return *f;
  }
  return task_families::multiple_choice();
}

}  // namespace archspace
