// The qa family's own functions (src/eval/tasks/qa.cpp, whose opening comment says how its metrics are computed),
// exposed for the unit tests: OLMES' SQuADF1EMRecallMetric of the QA tasks (naturalqs_open, squad, coqa, jeopardy).
#pragma once

#include <string>
#include <vector>

namespace archspace::genmetrics {

std::string squad_normalize(const std::string& s);  // SQuAD v1.1 normalize_answer
double squad_f1(const std::string& prediction, const std::string& gold);
double squad_em(const std::string& prediction, const std::string& gold);
double olmes_recall(const std::string& prediction, const std::vector<std::string>& golds);

}  // namespace archspace::genmetrics
