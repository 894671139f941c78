// The drop family's own functions (src/eval/tasks/drop.cpp, whose opening comment says how its metrics are computed),
// exposed for the unit tests: the official DROP metric.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace archspace::genmetrics {

// The official DROP EM and F1 of one predicted span against gold answers (each a list of spans), as lm-eval's
// drop process_results.
std::pair<double, double> drop_em_f1(const std::string& prediction,
                                     const std::vector<std::vector<std::string>>& gold_answers);
std::string drop_normalize(const std::string& span);  // lm-eval drop _normalize

}  // namespace archspace::genmetrics
