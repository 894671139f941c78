// The registries of task families, from the families' own registrations (eval/task_family_registration.h) as the
// build lists them (the generated archspace/task_families.h): no family is named here.
#include <algorithm>

#include "archspace/eval/task_family_registration.h"
#include "archspace/task_families.h"
#include "archspace/util/error.h"

namespace archspace {

namespace task_families {
#define ARCHSPACE_DECLARE_GENERATION_TASK_FAMILY(name) const GenerationTaskFamily& name();
#define ARCHSPACE_DECLARE_MULTIPLE_CHOICE_TASK_FAMILY(name) const MultipleChoiceTaskFamily& name();
ARCHSPACE_GENERATION_TASK_FAMILIES(ARCHSPACE_DECLARE_GENERATION_TASK_FAMILY)
ARCHSPACE_MULTIPLE_CHOICE_TASK_FAMILIES(ARCHSPACE_DECLARE_MULTIPLE_CHOICE_TASK_FAMILY)
#undef ARCHSPACE_DECLARE_GENERATION_TASK_FAMILY
#undef ARCHSPACE_DECLARE_MULTIPLE_CHOICE_TASK_FAMILY
}  // namespace task_families

const std::vector<const GenerationTaskFamily*>& generation_task_families() {
  static const std::vector<const GenerationTaskFamily*> families = {
#define ARCHSPACE_LIST_TASK_FAMILY(name) &task_families::name(),
      ARCHSPACE_GENERATION_TASK_FAMILIES(ARCHSPACE_LIST_TASK_FAMILY)
#undef ARCHSPACE_LIST_TASK_FAMILY
  };
  return families;
}

const std::vector<const MultipleChoiceTaskFamily*>& multiple_choice_task_families() {
  static const std::vector<const MultipleChoiceTaskFamily*> families = [] {
    std::vector<const MultipleChoiceTaskFamily*> v = {
#define ARCHSPACE_LIST_TASK_FAMILY(name) &task_families::name(),
        ARCHSPACE_MULTIPLE_CHOICE_TASK_FAMILIES(ARCHSPACE_LIST_TASK_FAMILY)
#undef ARCHSPACE_LIST_TASK_FAMILY
    };
    // The generic family, which has every task, after the others.
    std::stable_partition(v.begin(), v.end(), [](const auto* f) { return !f->takes_every_task(); });
    return v;
  }();
  return families;
}

const MultipleChoiceTaskFamily& multiple_choice_task_family(const std::string& task) {
  for (const auto* f : multiple_choice_task_families()) {
    if (f->has_task(task)) return *f;
  }
  throw Error("no multiple-choice task family has task \"" + task + "\" (the generic one takes every task)");
}

}  // namespace archspace
