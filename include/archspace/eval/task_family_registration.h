// How a task family registers itself: its file in src/eval/tasks/ ends, inside namespace archspace::task_families,
// with one line at the start of a line
//   ARCHSPACE_GENERATION_TASK_FAMILY(name, Type, order)        (eval/generation_task_family.h)
//   ARCHSPACE_MULTIPLE_CHOICE_TASK_FAMILY(name, Type, order)   (eval/multiple_choice_task_family.h)
// which defines task_families::name(), the family's one instance. The build reads these lines from every file of
// src/eval/tasks/ (cmake/task_families.cmake) and lists them in the generated archspace/task_families.h, from which
// src/eval/tasks/registry.cpp builds the registries: a new family is its file, and nothing else. `order` (an
// integer, unique among the families of a kind) is where the family stands in the registry, which is the order
// reports list the task groups in (a smaller one first).
#pragma once

#include "archspace/eval/generation_task_family.h"
#include "archspace/eval/multiple_choice_task_family.h"

#define ARCHSPACE_GENERATION_TASK_FAMILY(name, Type, order) \
  const ::archspace::GenerationTaskFamily& name() {         \
    static const Type family;                               \
    return family;                                          \
  }

#define ARCHSPACE_MULTIPLE_CHOICE_TASK_FAMILY(name, Type, order) \
  const ::archspace::MultipleChoiceTaskFamily& name() {          \
    static const Type family;                                    \
    return family;                                               \
  }
