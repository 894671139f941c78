// The minerva_math family's own functions (src/eval/tasks/minerva_math.cpp, whose opening comment says how its metrics
// are computed), exposed for the unit tests: the answer of a generation and its normalisation (lm-eval 0.4.3's, OLMES'
// pin).
#pragma once

#include <string>
#include <vector>

namespace archspace::genmetrics {

std::string minerva_unnormalized_answer(const std::string& generation);  // lm-eval get_unnormalized_answer
// normalize_final_answer as OLMES runs it (lm-eval 0.4.3's, which OLMES pins).
std::string minerva_normalize_final_answer(const std::string& answer);

}  // namespace archspace::genmetrics
