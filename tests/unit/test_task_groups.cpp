// Task groups without a model: the registry, expanding --tasks names, and the groups' macro and micro rows
// against averages recomputed here from the members' per-document outcomes.
#include <cmath>
#include <set>

#include "archspace/eval/task_files.h"
#include "archspace/eval/task_groups.h"
#include "test_support.h"

namespace archspace {
namespace {

using testing::expect_error;
using testing::fresh_dir;

// A member task whose documents come out as `correct` says (2 choices each, choice 0 the one scored best, so a
// document is right when its label is 0). acc_raw is the primary; acc_per_token and acc_per_char come along.
TaskResult member(const std::string& task, const std::string& format, const std::vector<int>& correct) {
  TaskFiles f;
  f.task = task;
  f.format = format;
  f.shots = 5;
  f.primary_metric = "acc_raw";
  std::vector<RequestScore> scores;
  for (size_t d = 0; d < correct.size(); ++d) {
    for (int64_t idx = 0; idx < 2; ++idx) {
      TaskRequest r;
      r.doc_id = static_cast<int64_t>(d);
      r.idx = idx;
      r.label = correct[d] ? 0 : 1;
      r.context = "Q:";
      r.continuation = idx == 0 ? " a" : " b";
      f.requests.push_back(r);
      scores.push_back({idx == 0 ? -1.0 : -2.0, false, 1});
    }
  }
  return task_metrics(f, scores);
}

const MetricValue& find(const TaskResult& r, const std::string& name, const std::string& aggregate) {
  for (const auto& m : r.metrics) {
    if (m.name == name && m.aggregate == aggregate) return m;
  }
  throw Error("no " + aggregate + " " + name + " in " + r.task);
}

TEST(TaskGroups, RegistryNamesOlmesSubjects) {
  const TaskGroup* mmlu = find_task_group("mmlu");
  ASSERT_NE(mmlu, nullptr);
  EXPECT_EQ(mmlu->members.size(), 57u);
  EXPECT_EQ(std::set<std::string>(mmlu->members.begin(), mmlu->members.end()).size(), 57u);
  EXPECT_EQ(mmlu->members.front(), "mmlu_abstract_algebra");
  EXPECT_EQ(mmlu->members.back(), "mmlu_world_religions");
  const TaskGroup* math = find_task_group("minerva_math");
  ASSERT_NE(math, nullptr);
  EXPECT_EQ(math->members, (std::vector<std::string>{"minerva_math_algebra", "minerva_math_counting_and_probability",
                                                     "minerva_math_geometry", "minerva_math_intermediate_algebra",
                                                     "minerva_math_number_theory", "minerva_math_prealgebra",
                                                     "minerva_math_precalculus"}));
  EXPECT_EQ(find_task_group("mmlu_anatomy"), nullptr);
}

TEST(TaskGroups, ExpandReplacesGroupsAndNamesWhatIsValid) {
  const auto root = fresh_dir("task_groups");
  const auto make = [&](const std::string& task) { std::filesystem::create_directories(root / task / "rc_0shot"); };
  make("toy");
  const TaskGroup* math = find_task_group("minerva_math");
  for (size_t i = 0; i + 1 < math->members.size(); ++i) make(math->members[i]);
  const std::vector<std::string> dirs = {root.string()};

  // One member without files: the group names it and where it looked.
  expect_error([&] { expand_task_groups(dirs, {"minerva_math"}); },
               {"task group minerva_math: 1 of its 7 tasks have no files", "minerva_math_precalculus", root.string()});
  make(math->members.back());
  const auto expanded = expand_task_groups(dirs, {"toy", "minerva_math", "minerva_math_geometry", "toy"});
  std::vector<std::string> want = {"toy"};
  want.insert(want.end(), math->members.begin(), math->members.end());
  EXPECT_EQ(expanded, want);

  // An unknown name lists the groups (with their first and last member) and the tasks outside groups.
  expect_error([&] { expand_task_groups(dirs, {"mmlu_anatomy_x"}); },
               {"unknown task \"mmlu_anatomy_x\"",
                "groups: mmlu (57 tasks: mmlu_abstract_algebra ... "
                "mmlu_world_religions), minerva_math (7 tasks",
                "; tasks: toy"});
  std::filesystem::remove_all(root);
}

TEST(TaskGroups, MacroAndMicroRowsEqualTheAveragesOfTheMembers) {
  const TaskGroup* math = find_task_group("minerva_math");
  // Members of different sizes, so that macro (mean of the means) and micro (pooled documents) differ.
  std::vector<TaskResult> results = {member("toy", "rc", {1, 0})};
  std::vector<std::vector<int>> outcomes;
  for (size_t i = 0; i < math->members.size(); ++i) {
    std::vector<int> docs;
    for (size_t d = 0; d < 2 + 3 * i; ++d) docs.push_back(static_cast<int>((d * 7 + i) % 3 == 0));
    outcomes.push_back(docs);
    results.push_back(member(math->members[i], "rc", docs));
  }
  results.push_back(member("after", "rc", {1}));

  std::vector<std::string> notes;
  const auto shown = with_group_results({"toy", "minerva_math", "after"}, results, &notes);
  EXPECT_TRUE(notes.empty());
  ASSERT_EQ(shown.size(), results.size() + 1);
  // The group's row comes right after its last member, before the next task.
  const TaskResult& g = shown[1 + math->members.size()];
  EXPECT_EQ(g.task, "minerva_math");
  EXPECT_EQ(shown.back().task, "after");
  EXPECT_EQ(g.members, 7);
  EXPECT_EQ(g.format, "rc");
  EXPECT_EQ(g.shots, 5);
  EXPECT_EQ(g.primary_metric, "acc_raw");

  double mean_of_means = 0, variance_sum = 0, pooled = 0;
  int64_t n = 0;
  std::vector<int> all;
  for (const auto& docs : outcomes) {
    double m = 0;
    for (int c : docs) m += c;
    m /= static_cast<double>(docs.size());
    double ss = 0;
    for (int c : docs) ss += (c - m) * (c - m);
    mean_of_means += m / 7.0;
    variance_sum += ss / static_cast<double>(docs.size() - 1) / static_cast<double>(docs.size());
    all.insert(all.end(), docs.begin(), docs.end());
    n += static_cast<int64_t>(docs.size());
  }
  for (int c : all) pooled += c;
  pooled /= static_cast<double>(n);
  double pooled_ss = 0;
  for (int c : all) pooled_ss += (c - pooled) * (c - pooled);
  EXPECT_EQ(g.documents, n);

  const MetricValue& macro = find(g, "acc_raw", "macro");
  EXPECT_TRUE(macro.primary);
  EXPECT_EQ(&macro, &g.metrics[0]);  // the primary first
  EXPECT_NEAR(macro.value, mean_of_means, 1e-12);
  EXPECT_NEAR(macro.stderr_, std::sqrt(variance_sum) / 7.0, 1e-12);
  const MetricValue& micro = find(g, "acc_raw", "micro");
  EXPECT_FALSE(micro.primary);
  EXPECT_NEAR(micro.value, pooled, 1e-12);
  EXPECT_NEAR(micro.stderr_, std::sqrt(pooled_ss / static_cast<double>(n - 1) / static_cast<double>(n)), 1e-12);
  EXPECT_GT(std::abs(macro.value - micro.value), 1e-3);                       // the two averages are told apart
  EXPECT_NEAR(find(g, "acc_per_char", "macro").value, mean_of_means, 1e-12);  // every shared metric, both ways
  EXPECT_NEAR(find(g, "acc_per_token", "micro").value, pooled, 1e-12);
  EXPECT_FALSE(find(g, "acc_per_token", "macro").primary);

  // JSON rows mark the group's rows; the table prints the group as "(macro)".
  const auto rows = results_rows(shown);
  int group_rows = 0;
  for (const auto& row : rows) {
    if (row["task"] == "minerva_math") {
      ++group_rows;
      EXPECT_EQ(row["members"], 7);
      EXPECT_TRUE(row["aggregate"] == "macro" || row["aggregate"] == "micro");
      EXPECT_EQ(row["n"], n);
    } else {
      EXPECT_FALSE(row.contains("aggregate"));
    }
  }
  EXPECT_EQ(group_rows, 6);  // acc_raw, acc_per_token, acc_per_char: each macro and micro
  const std::string table = results_table(shown);
  EXPECT_NE(table.find("minerva_math (macro)"), std::string::npos) << table;
  EXPECT_LT(table.find("minerva_math_precalculus"), table.find("minerva_math (macro)"));
  EXPECT_LT(table.find("minerva_math (macro)"), table.find("after"));
}

TEST(TaskGroups, AFormatSomeMembersLackGetsNoRowButANote) {
  const TaskGroup* math = find_task_group("minerva_math");
  std::vector<TaskResult> results;
  for (const auto& m : math->members) {
    results.push_back(member(m, "rc", {1, 0, 1}));
    if (m != "minerva_math_geometry") results.push_back(member(m, "mc", {0, 0, 1}));
  }
  std::vector<std::string> notes;
  const auto shown = with_group_results({"minerva_math"}, results, &notes);
  ASSERT_EQ(shown.size(), results.size() + 1);
  EXPECT_EQ(shown.back().task, "minerva_math");
  EXPECT_EQ(shown.back().format, "rc");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("no minerva_math row for mc 5-shot: 6 of its 7 tasks"), std::string::npos) << notes[0];
  // A group not asked for adds nothing.
  EXPECT_EQ(with_group_results({"minerva_math_algebra"}, results).size(), results.size());
}

}  // namespace
}  // namespace archspace
