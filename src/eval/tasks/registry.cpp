// The one list of generation task families: a new family is one file in this folder and one line here.
#include "families.h"

namespace archspace {

const std::vector<const GenerationTaskFamily*>& generation_task_families() {
  static const std::vector<const GenerationTaskFamily*> families = {
      &task_families::gsm8k(),  &task_families::minerva_math(), &task_families::drop(),  &task_families::qa(),
      &task_families::ifeval(), &task_families::bbh(),          &task_families::popqa(), &task_families::code(),
  };
  return families;
}

}  // namespace archspace
