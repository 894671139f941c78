// The popqa family's own functions (src/eval/tasks/popqa.cpp, whose opening comment says how its metrics are computed),
// exposed for the unit tests: OLMES' alias match.
#pragma once

#include <string>
#include <vector>

namespace archspace::genmetrics {

// OLMES' PopQA match: some alias a with a, a.lower() or a.capitalize() a substring of the generation.
bool popqa_match(const std::string& generation, const std::vector<std::string>& aliases);

}  // namespace archspace::genmetrics
