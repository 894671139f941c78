// codex_humaneval, codex_mbpp: pass_at_1, the generated program run against the task's tests (greedy, one sample:
// pass@1 is 1 when it passes) by the caller's CodeExecutor (the CLI's sandbox, eval/code_sandbox.h). The program as
// OLMES assembles it (as AI2's olmo_eval restates oe-eval's evals/tasks/humaneval.py and mbpp.py): HumanEval prompt +
// generation + "\n" + test + "\ncheck(entry_point)"; MBPP generation + "\n" + the test_list asserts joined by "\n"
// (test_setup_code is not run, as there). Gold: HumanEval {"prompt", "test", "entry_point"}, MBPP {"test_list"},
// from the request line's doc.
#include "archspace/eval/tasks/code.h"

#include "archspace/eval/task_family_registration.h"
#include "archspace/util/error.h"

namespace archspace {

namespace {

bool is_humaneval(const GenerationTaskSpec& spec) { return spec.task == "codex_humaneval"; }

std::vector<std::string> gold_keys(const GenerationTaskSpec& spec) {
  return is_humaneval(spec) ? std::vector<std::string>{"prompt", "test", "entry_point"}
                            : std::vector<std::string>{"test_list"};
}

}  // namespace

namespace genmetrics {

std::string code_program(const GenerationTaskSpec& spec, const std::string& generation, const nlohmann::json& gold) {
  if (is_humaneval(spec))
    return gold["prompt"].get<std::string>() + generation + "\n" + gold["test"].get<std::string>() + "\ncheck(" +
           gold["entry_point"].get<std::string>() + ")";
  if (spec.task == "codex_mbpp") {
    std::string tests;
    for (const auto& t : gold["test_list"]) {
      if (!tests.empty()) tests += '\n';
      tests += t.get<std::string>();
    }
    return generation + "\n" + tests;
  }
  throw Error("code_program: task " + spec.task + " is not a code task");
}

}  // namespace genmetrics

namespace task_families {
namespace {

class Code final : public GenerationTaskFamily {
 public:
  std::vector<GenerationTaskSpec> tasks() const override {
    return {{"codex_humaneval", "", {"pass_at_1"}, "pass_at_1"}, {"codex_mbpp", "", {"pass_at_1"}, "pass_at_1"}};
  }
  void check_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) const override {
    if (is_humaneval(spec)) {
      for (const char* key : {"prompt", "test", "entry_point"}) {
        if (!gold.is_object() || !gold.contains(key) || !gold[key].is_string())
          throw Error(std::string("field \"gold\" must be an object with the strings \"prompt\", \"test\" and "
                                  "\"entry_point\" (task ") +
                      spec.task + "): \"" + key + "\" is missing or not a string");
      }
      if (gold["entry_point"].get<std::string>().empty())
        throw Error("field \"gold\": \"entry_point\" is empty (task " + spec.task + ")");
    } else if (!gold.is_object() || !gold.contains("test_list") || !all_strings(gold["test_list"])) {
      throw Error("field \"gold\" must be an object with \"test_list\", a non-empty list of strings (task " +
                  spec.task + ")");
    }
  }
  // The doc's test fields.
  nlohmann::json gold_from_request(const GenerationTaskSpec& spec, const nlohmann::json& line) const override {
    nlohmann::json gold = nlohmann::json::object();
    for (const auto& key : gold_keys(spec)) {
      if (!line.is_object() || !line.contains("doc") || !line["doc"].is_object() || !line["doc"].contains(key))
        throw Error("missing field \"doc." + key + "\" (the tests of task " + spec.task + ")");
      gold[key] = line["doc"][key];
    }
    try {
      check_gold(spec, gold);
    } catch (const Error& e) {
      throw Error(std::string("field \"doc\": ") + e.what());
    }
    return gold;
  }
  void score(const std::vector<const GenerationInstance*>& batch, const ExternalScorers& scorers,
             const std::vector<InstanceMetrics*>& out) const override {
    std::vector<std::string> programs;  // run together
    std::vector<InstanceMetrics*> program_of;
    score_each(batch, out, [&](const GenerationInstance& x, InstanceMetrics& m) {
      programs.push_back(genmetrics::code_program(*find_generation_task(x.task), x.generation, x.gold));
      program_of.push_back(&m);
    });
    if (programs.empty()) return;
    if (!scorers.execute)
      throw Error(
          "code tasks (codex_humaneval, codex_mbpp) run their programs against the tests, and no executor "
          "(sandbox) was given");
    const std::vector<bool> passed = scorers.execute(programs);
    if (passed.size() != programs.size())
      throw Error("the code executor answered " + std::to_string(passed.size()) + " programs for " +
                  std::to_string(programs.size()));
    for (size_t k = 0; k < programs.size(); ++k) set_metric(*program_of[k], "pass_at_1", passed[k] ? 1.0 : 0.0);
  }
  ExternalScorer external_scorer() const override { return ExternalScorer::program_execution; }
};

}  // namespace

ARCHSPACE_GENERATION_TASK_FAMILY(code, Code, 80)

}  // namespace task_families
}  // namespace archspace
