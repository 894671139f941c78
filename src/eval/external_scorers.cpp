#include "archspace/eval/external_scorers.h"

#include <stdlib.h>

#include <filesystem>

#include "archspace/eval/code_sandbox.h"
#include "archspace/util/error.h"
#include "archspace/util/files.h"
#include "archspace/util/json_file.h"
#include "archspace/util/python_scripts.h"

namespace archspace {

namespace {

// One call of a project Python scorer: `input` written to a file of a scratch directory (removed afterwards), the
// script's JSON answer read back. `what` says in errors what could not be scored.
nlohmann::json run_scorer(const char* script, const std::string& input, const std::string& what) {
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "archspace-scorer-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw Error("cannot create a scratch directory: " + what + " could not be scored");
  const fs::path dir(tmpl);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};
  const std::string in_path = (dir / "input.json").string(), out_path = (dir / "output.json").string();
  write_text_file_atomically(in_path, input);
  const int status = run_python_script(script, {in_path, out_path});
  if (status != 0)
    throw Error(std::string(script) + " failed (exit status " + std::to_string(status) + "): " + what +
                " could not be scored");
  return parse_json_text(read_text_file(out_path), out_path);
}

// Minerva's is_equiv as OLMES runs it, lm-eval 0.4.3's (scripts/minerva_equiv.py).
std::vector<bool> minerva_equivalence(const std::vector<std::pair<std::string, std::string>>& pairs) {
  nlohmann::json in = {{"pairs", nlohmann::json::array()}};
  for (const auto& [answer, gold] : pairs) in["pairs"].push_back({answer, gold});
  const nlohmann::json answer = run_scorer(ARCHSPACE_MINERVA_SCORER, in.dump(), "the Minerva MATH answers");
  try {
    return answer.at("equivalent").get<std::vector<bool>>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string(ARCHSPACE_MINERVA_SCORER) + ": not the scorer's answer (" + e.what() + ")");
  }
}

// IFEval's instruction checks through lm-eval's own code (scripts/ifeval_score.py).
std::vector<InstructionResult> ifeval_checks(const std::vector<std::pair<nlohmann::json, std::string>>& pairs) {
  nlohmann::json in = {{"instances", nlohmann::json::array()}};
  for (const auto& [doc, response] : pairs) in["instances"].push_back({{"doc", doc}, {"response", response}});
  const nlohmann::json answer =
      run_scorer(ARCHSPACE_IFEVAL_SCORER, in.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                 "the IFEval responses");
  std::vector<InstructionResult> results;
  try {
    for (const auto& r : answer.at("results")) {
      InstructionResult x;
      x.prompt_strict = r.at("prompt_level_strict_acc").get<bool>();
      x.prompt_loose = r.at("prompt_level_loose_acc").get<bool>();
      x.inst_strict = r.at("inst_level_strict_acc").get<std::vector<bool>>();
      x.inst_loose = r.at("inst_level_loose_acc").get<std::vector<bool>>();
      if (r.contains("scoring_errors")) x.scoring_errors = r.at("scoring_errors").get<std::vector<std::string>>();
      results.push_back(std::move(x));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string(ARCHSPACE_IFEVAL_SCORER) + ": not the scorer's answer (" + e.what() + ")");
  }
  return results;
}

// The code tasks' programs in the sandbox (eval/code_sandbox.h), OLMES' 3 s each, a few at a time; a note counts
// the outcomes. Fails closed: without isolation nothing runs and the error says what is missing.
CodeExecutor sandbox_executor(const std::function<void(const std::string&)>& note) {
  return [note](const std::vector<std::string>& programs) {
    const std::vector<SandboxResult> results = run_python_sandboxed(programs, SandboxLimits{});
    std::vector<bool> passed;
    int64_t n_passed = 0, n_timed_out = 0;
    for (const auto& r : results) {
      passed.push_back(r.passed);
      n_passed += r.passed;
      n_timed_out += r.status == "timed out";
    }
    if (note) {
      note(std::to_string(programs.size()) + " programs run in the sandbox: " + std::to_string(n_passed) + " passed, " +
           std::to_string(n_timed_out) + " timed out, " +
           std::to_string(static_cast<int64_t>(programs.size()) - n_passed - n_timed_out) + " failed");
    }
    return passed;
  };
}

}  // namespace

ExternalScorers project_scorers(const std::function<void(const std::string&)>& note) {
  return {minerva_equivalence, ifeval_checks, sandbox_executor(note)};
}

void check_python_scorers() {
  const std::vector<bool> equivalent = minerva_equivalence({{"\\frac{1}{2}", "0.5"}});
  if (equivalent != std::vector<bool>{true})
    throw Error(std::string(ARCHSPACE_MINERVA_SCORER) + " did not find \\frac{1}{2} equal to 0.5");
  const nlohmann::json doc = {{"key", 0},
                              {"prompt", "Answer without commas."},
                              {"instruction_id_list", {"punctuation:no_comma"}},
                              {"kwargs", {nlohmann::json::object()}}};
  const std::vector<InstructionResult> checked = ifeval_checks({{doc, "no commas here"}});
  if (checked.size() != 1 || !checked[0].prompt_strict || !checked[0].scoring_errors.empty())
    throw Error(std::string(ARCHSPACE_IFEVAL_SCORER) + " did not find a response without commas to have none" +
                (checked.size() == 1 && !checked[0].scoring_errors.empty() ? " (" + checked[0].scoring_errors[0] + ")"
                                                                           : std::string()));
}

}  // namespace archspace
