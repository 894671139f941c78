// The bbh family's own functions (src/eval/tasks/bbh.cpp, whose opening comment says how its metrics are computed),
// exposed for the unit tests: OLMES' answer extraction per subtask.
#pragma once

#include <string>
#include <vector>

namespace archspace::genmetrics {

// OLMES' BBH answer of a generation for one subtask ("date_understanding", ...); its answer pattern ("MC":
// a lettered choice).
// corrected: the bare-capital last resort with word boundaries (r"\b([A-Z])\b"), not OLMES' backspaces.
std::string bbh_extract_answer(const std::string& generation, const std::string& subtask, bool corrected = false);
const std::string& bbh_answer_pattern(const std::string& subtask);  // throws for a subtask OLMES does not have

}  // namespace archspace::genmetrics
