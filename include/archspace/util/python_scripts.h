// The project's Python scripts (scripts/: the plots, lm-eval's Minerva and IFEval scorers), run with the python
// that has their packages: $ARCHSPACE_PYTHON, else the build's venv (scripts/setup.sh installs it).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace archspace {

// The python the scripts run with: $ARCHSPACE_PYTHON, else the build's venv.
std::string scripts_python();

// Runs `script` with scripts_python() and waits: its exit status, or 128 + the signal that ended it. Throws when
// python cannot be started (naming it and ARCHSPACE_PYTHON).
int run_python_script(const std::string& script, const std::vector<std::string>& args);

// One call of a project script that answers JSON with JSON: `input` written to a file of a scratch directory
// (removed afterwards), `script INPUT OUTPUT` run, OUTPUT parsed. A failed run throws "SCRIPT failed (exit status
// N): WHAT", with the script's own {"error": ...} from OUTPUT when it left one.
nlohmann::json run_python_json(const char* script, const std::string& input, const std::string& what);

}  // namespace archspace
