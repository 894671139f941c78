#include "archspace/eval/external_scorers.h"

#include "archspace/eval/code_sandbox.h"
#include "archspace/util/error.h"
#include "archspace/util/python_scripts.h"

namespace archspace {

namespace {

// Minerva's is_equiv as OLMES runs it, lm-eval 0.4.3's (scripts/minerva_equiv.py).
std::vector<bool> minerva_equivalence(const std::vector<std::pair<std::string, std::string>>& pairs) {
  nlohmann::json in = {{"pairs", nlohmann::json::array()}};
  for (const auto& [answer, gold] : pairs) in["pairs"].push_back({answer, gold});
  const nlohmann::json answer =
      run_python_json(ARCHSPACE_MINERVA_SCORER, in.dump(), "the Minerva MATH answers could not be scored");
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
      run_python_json(ARCHSPACE_IFEVAL_SCORER, in.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                      "the IFEval responses could not be scored");
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
