// The task families (eval/generation_task_family.h, eval/multiple_choice_task_family.h), one file each in this
// folder; registry.cpp lists them.
#pragma once

#include "archspace/eval/generation_task_family.h"
#include "archspace/eval/multiple_choice_task_family.h"

namespace archspace::task_families {

const GenerationTaskFamily& gsm8k();
const GenerationTaskFamily& minerva_math();
const GenerationTaskFamily& drop();
const GenerationTaskFamily& qa();  // naturalqs_open, squad, coqa, jeopardy
const GenerationTaskFamily& ifeval();
const GenerationTaskFamily& bbh();
const GenerationTaskFamily& popqa();
const GenerationTaskFamily& code();  // codex_humaneval, codex_mbpp

const MultipleChoiceTaskFamily& truthfulqa();
const MultipleChoiceTaskFamily& mmlu();
const MultipleChoiceTaskFamily& multiple_choice();  // the generic one: every other task

}  // namespace archspace::task_families
