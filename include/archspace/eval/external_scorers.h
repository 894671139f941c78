// The scorers the generation metrics take from outside C++ (eval/generation_task_family.h: ExternalScorers), as
// `eval downstream` and in-loop `[eval] downstream` both run them: lm-eval's own Python where C++ cannot reproduce
// it (scripts/minerva_equiv.py: Minerva's is_equiv with sympy; scripts/ifeval_score.py: IFEval's instruction
// checks), and the code sandbox (eval/code_sandbox.h) for the code tasks' programs.
#pragma once

#include <functional>
#include <string>

#include "archspace/eval/generation_task_family.h"

namespace archspace {

// Each Python scorer called once per scoring with every instance that needs it (its input and answer in a scratch
// directory, removed afterwards); the sandbox's outcomes counted in one `note` per call.
ExternalScorers project_scorers(const std::function<void(const std::string&)>& note);

// Scores one known pair with each Python scorer (Minerva: \frac{1}{2} equals 0.5; IFEval: a response without a
// comma follows punctuation:no_comma) and throws when either cannot run or answers otherwise: for a caller that
// would score much later (training's evaluations), so that a missing package fails at setup.
void check_python_scorers();

}  // namespace archspace
