// The gsm8k family's own functions (src/eval/tasks/gsm8k.cpp, whose opening comment says how its metrics are computed),
// exposed for the unit tests: OLMES' answer (the last number), lm-eval's flexible-extract and the task config's
// metric_kwargs.
#pragma once

#include <string>
#include <vector>

namespace archspace::genmetrics {

std::string gsm8k_last_number(const std::string& generation);  // OLMES gsm8k's extracted answer
std::string gsm8k_flex(const std::string& generation);         // lm-eval's flexible-extract
extern const std::vector<std::string> kGsm8kRegexesToIgnore;   // the task config's metric_kwargs

}  // namespace archspace::genmetrics
