// The code family's own functions (src/eval/tasks/code.cpp, whose opening comment says how its metrics are computed),
// exposed for the unit tests: the program a generation of codex_humaneval or codex_mbpp runs as.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "archspace/eval/generation_metrics.h"

namespace archspace::genmetrics {

// The program a code task runs for one generation (gold checked by check_gold).
std::string code_program(const GenerationTaskSpec& spec, const std::string& generation, const nlohmann::json& gold);

}  // namespace archspace::genmetrics
