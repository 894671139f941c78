// The suite table (eval/suites.h) as a reader sees it: one line per task with its columns, whatever the length of a
// missing group's list of member tasks (BBH's 27 names once ran into the next row), for a suite with every task
// missing and with every task present.
#include <sstream>

#include "archspace/eval/suites.h"
#include "archspace/eval/task_groups.h"
#include "archspace/util/strings.h"
#include "test_support.h"

namespace archspace {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> words_of(const std::string& line) {
  std::vector<std::string> words;
  std::istringstream in(line);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// The table's rows (after the title and the header), checked to be one per task in the suite's order.
std::vector<std::vector<std::string>> task_rows(const Suite& suite, const std::string& table) {
  const std::vector<std::string> lines = lines_of(table);
  // "", "suite NAME (values x 100)", the header, one row per task, the macro line; the text ends with its newline.
  EXPECT_EQ(table.back(), '\n');
  EXPECT_EQ(lines.size(), suite.tasks.size() + 4) << table;
  EXPECT_EQ(words_of(lines.at(2)),
            (std::vector<std::string>{"task", "metric", "value", "+-", "stderr", "shots", "olmes", "n"}));
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < suite.tasks.size() && 3 + i < lines.size(); ++i) {
    rows.push_back(words_of(lines[3 + i]));
    EXPECT_EQ(rows.back().at(0), suite.tasks[i].name) << lines[3 + i];
    // No row holds another task's row: the next task's name never follows a cell's text without a newline.
    for (const auto& other : suite.tasks) {
      if (other.name == suite.tasks[i].name) continue;
      EXPECT_EQ(lines[3 + i].find(other.name + " "), std::string::npos) << lines[3 + i];
    }
  }
  EXPECT_EQ(words_of(lines.back()).at(0), "macro");
  return rows;
}

TEST(SuiteTable, EveryTaskMissingKeepsOneLinePerTaskAndShortensLongLists) {
  const Suite* suite = find_suite("olmo3-sft");
  ASSERT_NE(suite, nullptr);
  // No directory to look in: every task and every group member is missing.
  const SuitePlan plan = plan_suite(*suite, {testing::fresh_dir("suite-table-empty").string()});
  const SuiteReport report = suite_report(plan, {});
  ASSERT_EQ(report.missing.size(), suite->tasks.size());
  const std::string table = suite_table(report);
  const auto rows = task_rows(*suite, table);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const SuiteTask& t = suite->tasks[i];
    // task, metric, "-" (value), "-" (shots), OLMES' shots, "-" (n), "missing:", why
    ASSERT_GE(r.size(), 8u);
    EXPECT_EQ(r[1], t.metric);
    EXPECT_EQ(r[2], "-");
    EXPECT_EQ(r[3], "-");
    EXPECT_EQ(r[4], std::to_string(t.shots));
    EXPECT_EQ(r[5], "-");
    EXPECT_EQ(r[6], "missing:");
  }
  // BBH's 27 members: the table names the first three and counts the rest; the JSON keeps every name.
  const TaskGroup* bbh = find_task_group("bbh");
  ASSERT_NE(bbh, nullptr);
  const std::string bbh_row = lines_of(table).at(3);
  const std::string more = "(+" + std::to_string(bbh->members.size() - 3) + " more)";
  EXPECT_NE(bbh_row.find(more), std::string::npos) << bbh_row;
  EXPECT_NE(bbh_row.find(bbh->members[2]), std::string::npos) << bbh_row;
  EXPECT_EQ(bbh_row.find(bbh->members[3]), std::string::npos) << bbh_row;
  const nlohmann::json json = suite_json(report);
  const std::string json_missing = json["rows"][0]["missing"];
  for (const auto& m : bbh->members) EXPECT_NE(json_missing.find(m), std::string::npos) << m;
  EXPECT_EQ(words_of(lines_of(table).back()),
            (std::vector<std::string>{"macro", "-", "-", "no", "task", "of", "the", "suite", "had", "files"}));
}

TEST(SuiteTable, EveryTaskPresentShowsValueShotsAndCount) {
  const Suite* suite = find_suite("olmo3-sft");
  ASSERT_NE(suite, nullptr);
  SuitePlan plan;
  plan.suite = suite;
  std::vector<TaskResult> results;
  double sum = 0;
  for (size_t i = 0; i < suite->tasks.size(); ++i) {
    const SuiteTask& t = suite->tasks[i];
    const TaskGroup* group = find_task_group(t.name);
    SuitePlan::Entry e;
    e.task = t;
    e.members = group ? group->members : std::vector<std::string>{t.name};
    plan.entries.push_back(e);
    TaskResult r;
    r.task = t.name;
    r.format = t.kind;
    r.shots = t.shots;
    r.documents = 100 + static_cast<int64_t>(i);
    r.members = group ? static_cast<int64_t>(group->members.size()) : 0;
    MetricValue m;
    m.name = t.metric;
    m.value = 0.125 * static_cast<double>(i % 8);  // exact in binary: the table's rounding is the only one
    m.stderr_ = 0.01;
    m.primary = true;
    if (group) m.aggregate = group->primary_aggregate;
    sum += m.value;
    r.metrics.push_back(m);
    results.push_back(r);
  }
  const SuiteReport report = suite_report(plan, results);
  EXPECT_TRUE(report.missing.empty());
  const std::string table = suite_table(report);
  const auto rows = task_rows(*suite, table);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const SuiteTask& t = suite->tasks[i];
    // task, metric, value, "+-", stderr, shots, OLMES' shots, n: eight columns and nothing after
    ASSERT_EQ(r.size(), 8u) << join(r, " ");
    EXPECT_EQ(r[1], t.metric);
    EXPECT_EQ(r[2], format_string("%.1f", 100 * 0.125 * static_cast<double>(i % 8)));
    EXPECT_EQ(r[3], "+-");
    EXPECT_EQ(r[4], "1.0");
    EXPECT_EQ(r[5], std::to_string(t.shots));
    EXPECT_EQ(r[6], std::to_string(t.shots));
    EXPECT_EQ(r[7], std::to_string(100 + i));
  }
  const auto macro = words_of(lines_of(table).back());
  // "macro", "mean of the above", the value, "over 8 of 8 tasks"
  ASSERT_GE(macro.size(), 6u);
  EXPECT_EQ(macro[5], format_string("%.1f", 100 * sum / static_cast<double>(suite->tasks.size())));
}

TEST(SuiteTable, PromptsThatDifferFromOlmesAreSaidOnceUnderTheTableAndInTheirRow) {
  const Suite* suite = find_suite("olmo3-sft");
  ASSERT_NE(suite, nullptr);
  const SuitePlan plan = plan_suite(*suite, {testing::fresh_dir("suite-table-prompts").string()});
  const std::string how = "not drop::llama3's prompts: the installed files are drop::olmes's";
  const SuiteReport report = suite_report(plan, {}, {{"drop", how}, {"not_in_the_suite", "ignored"}});
  const std::vector<std::string> lines = lines_of(suite_table(report));
  ASSERT_EQ(lines.size(), suite->tasks.size() + 5);
  EXPECT_EQ(words_of(lines[lines.size() - 2]).at(0), "macro");
  EXPECT_EQ(lines.back(), "drop: " + how);
  const nlohmann::json json = suite_json(report);
  size_t with = 0;
  for (const auto& row : json["rows"]) {
    if (!row.contains("prompts_differ")) continue;
    ++with;
    EXPECT_EQ(row["task"], "drop");
    EXPECT_EQ(row["prompts_differ"], how);
  }
  EXPECT_EQ(with, 1u);
}

TEST(SuiteTable, JoinBriefCountsWhatItLeavesOut) {
  EXPECT_EQ(join_brief({"a", "b"}, 3), "a, b");
  EXPECT_EQ(join_brief({"a", "b", "c", "d", "e"}, 2), "a, b, ... (+3 more)");
  EXPECT_EQ(format_string("%s-%d", std::string(600, 'x').c_str(), 7).size(), 602u);
}

}  // namespace
}  // namespace archspace
