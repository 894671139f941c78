// The generation task registry (eval/generation_task_family.h): every task defined by one family, metrics set and
// read by name, the families' hooks (chat markers, the sandbox), and the text module the families build on
// (text/utf8.h, text/python_str.h, text/python_re.h).
#include <gtest/gtest.h>

#include <initializer_list>
#include <map>

#include "archspace/chat/chat.h"
#include "archspace/eval/chat_format.h"
#include "archspace/eval/generation_task_family.h"
#include "archspace/text/python_re.h"
#include "archspace/text/python_str.h"
#include "archspace/text/utf8.h"
#include "archspace/util/error.h"
#include "test_support.h"

namespace archspace {
namespace {

TEST(GenerationTaskRegistry, EveryTaskIsDefinedByOneRegisteredFamily) {
  std::map<std::string, int> defined;
  for (const GenerationTaskFamily* family : generation_task_families()) {
    for (const auto& spec : family->tasks()) ++defined[spec.task];
  }
  const std::vector<std::string> names = generation_task_names();
  ASSERT_EQ(defined.size(), names.size());
  for (const auto& name : names) {
    EXPECT_EQ(defined[name], 1) << name;
    const GenerationTaskSpec* spec = find_generation_task(name);
    ASSERT_NE(spec, nullptr) << name;
    ASSERT_NE(spec->family, nullptr) << name;
    EXPECT_EQ(spec->metrics.front(), spec->primary_metric) << name;
  }
  EXPECT_EQ(names.size(), 1u + 8u + 1u + 4u + 1u + 27u + 1u + 2u);  // gsm8k, minerva, drop, QA, ifeval, bbh, ...
}

TEST(GenerationTaskRegistry, IfEvalResultsAreKeyedByMetricName) {
  GenerationInstance x{"ifeval", 7, nullptr, "a response",
                       nlohmann::json::parse(R"({"key": 7, "prompt": "p", "instruction_id_list": ["a", "b"],
                                                 "kwargs": [{}, {}]})")};
  const InstructionCheck checks = [](const std::vector<std::pair<nlohmann::json, std::string>>& pairs) {
    InstructionResult r;
    r.prompt_strict = true;  // deliberately unlike loose, to tell the four apart
    r.prompt_loose = false;
    r.inst_strict = {true, false};
    r.inst_loose = {true, true};
    return std::vector<InstructionResult>(pairs.size(), r);
  };
  const std::vector<InstanceMetrics> m = score_generations({x}, nullptr, checks);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(metric_value(m[0], "prompt_level_strict_acc"), 1.0);
  EXPECT_EQ(metric_value(m[0], "prompt_level_loose_acc"), 0.0);
  EXPECT_EQ(metric_value(m[0], "inst_level_strict_acc"), 0.5);
  EXPECT_EQ(metric_value(m[0], "inst_level_loose_acc"), 1.0);
  EXPECT_EQ(m[0].values.front().first, "prompt_level_loose_acc");  // the registry's order, primary first
  InstanceMetrics copy = m[0];
  testing::expect_error([&] { set_metric(copy, "acc", 1.0); }, {"no metric \"acc\""});
  testing::expect_error([&] { metric_value(copy, "acc"); }, {"no metric \"acc\""});
}

TEST(GenerationTaskRegistry, AnInstanceWhoseScoringRaisesScoresZeroWithItsError) {
  // A gold of the wrong type (unchecked here) makes gsm8k's scoring raise: that instance is zeroed on every metric
  // and names the error; the others are scored.
  const std::vector<InstanceMetrics> m =
      score_generations({{"gsm8k", 1, nullptr, "so 4", "4"}, {"gsm8k", 2, nullptr, "so 4", 4}}, nullptr);
  EXPECT_EQ(metric_value(m[0], "exact_match"), 1.0);
  EXPECT_EQ(metric_value(m[0], "exact_match_flex"), 1.0);
  EXPECT_TRUE(m[0].scoring_errors.empty());
  EXPECT_EQ(metric_value(m[1], "exact_match"), 0.0);
  EXPECT_EQ(metric_value(m[1], "exact_match_flex"), 0.0);
  EXPECT_EQ(m[1].scoring_errors.size(), 1u);
}

TEST(GenerationTaskRegistry, FamiliesGiveTheirPromptMarkersAndNeeds) {
  EXPECT_EQ(few_shot_markers("minerva_math_algebra").question, "Problem:");
  EXPECT_EQ(few_shot_markers("minerva_math_500").answer, "\n\nSolution:");
  EXPECT_EQ(few_shot_markers("drop").question, "Passage:");
  EXPECT_EQ(few_shot_markers("squad").question, "Title:");
  EXPECT_EQ(few_shot_markers("jeopardy").question, "Category:");
  EXPECT_EQ(few_shot_markers("bbh_navigate").question, "Q:");
  EXPECT_EQ(few_shot_markers("coqa").question, "Question:");
  EXPECT_EQ(few_shot_markers("gsm8k").answer, "\nAnswer:");
  EXPECT_EQ(few_shot_markers("truthfulqa_mc2").question, "Q:");
  EXPECT_EQ(few_shot_markers("arc_easy").question, "Question:");
  EXPECT_TRUE(runs_programs("codex_mbpp"));
  EXPECT_TRUE(runs_programs("codex_humaneval"));
  EXPECT_FALSE(runs_programs("gsm8k"));
  EXPECT_FALSE(runs_programs("arc_easy"));
  EXPECT_TRUE(find_generation_task("minerva_math_algebra")->family->needs_external_scorer());
  EXPECT_TRUE(find_generation_task("ifeval")->family->needs_external_scorer());
  EXPECT_FALSE(find_generation_task("drop")->family->needs_external_scorer());
}

// OLMES' instruct (::tulu) chat settings per task (eval/chat_format.h), from olmes oe_eval/configs/tasks.py and the
// task files' chat_overrides: what the conversations below are built with.
TEST(GenerationTaskRegistry, FamiliesGiveOlmesChatSettings) {
  EXPECT_EQ(chat_settings("gsm8k").assistant_prefix, "Answer:");
  EXPECT_TRUE(chat_settings("gsm8k").fewshot_as_multiturn);
  EXPECT_FALSE(chat_settings("drop").fewshot_as_multiturn);
  EXPECT_FALSE(chat_settings("truthfulqa").fewshot_as_multiturn);
  for (const char* task : {"minerva_math_algebra", "mmlu_anatomy", "bbh_navigate", "popqa", "ifeval"}) {
    EXPECT_TRUE(chat_settings(task).fewshot_as_multiturn) << task;
    EXPECT_EQ(chat_settings(task).assistant_prefix, "") << task;
  }
  EXPECT_EQ(few_shot_markers("bbh_navigate").answer, "\nA: Let's think step by step.");
  EXPECT_EQ(few_shot_markers("popqa").question, "Q:");
  EXPECT_EQ(few_shot_markers("popqa").answer, " A:");
}

nlohmann::json turns(std::initializer_list<std::pair<const char*, const char*>> list) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [role, content] : list) out.push_back({{"role", role}, {"content", content}});
  return out;
}

TEST(GenerationTaskRegistry, PlainContextsBecomeOlmesConversations) {
  // gsm8k::tulu: the prefix "Answer:" (and the whitespace before it) leaves the user turns, opens the assistant
  // turns (concat_with_space strips the answer) and ends the prompt.
  const std::string gsm8k =
      "Question: 1+1?\nAnswer: 1+1=2. #### 2 \n\nQuestion: 2+2?\nAnswer: 4. #### 4\n\n"
      "Question: 3+3?\nAnswer:";
  ChatPrompt p = chat_prompt(gsm8k, "gsm8k", 2, "t");
  EXPECT_EQ(p.messages, turns({{"user", "Question: 1+1?"},
                               {"assistant", "Answer: 1+1=2. #### 2"},
                               {"user", "Question: 2+2?"},
                               {"assistant", "Answer: 4. #### 4"},
                               {"user", "Question: 3+3?"}}));
  EXPECT_EQ(p.assistant_prefix, "Answer:");
  // 0 shots: the user turn as it is (OLMES strips the prefix only from few-shot turns).
  EXPECT_EQ(chat_prompt("Question: 3+3?\nAnswer:", "gsm8k", 0, "t").messages,
            turns({{"user", "Question: 3+3?\nAnswer:"}}));
  // drop::llama3 and truthfulqa::tulu: the shots and the question in one user turn, no prefix.
  const std::string tqa = "Q: a?\nA: b.\n\nQ: c?\nA:";
  p = chat_prompt(tqa, "truthfulqa", 1, "t");
  EXPECT_EQ(p.messages, turns({{"user", "Q: a?\nA: b.\n\nQ: c?\nA:"}}));
  EXPECT_EQ(p.assistant_prefix, "");
  EXPECT_EQ(chat_prompt("Passage: p\nQuestion: q\nAnswer: 1\n\nPassage: p\nQuestion: r\nAnswer:", "drop", 1, "t")
                .messages.size(),
            1u);
  // popqa::tulu: multiturn at its own markers "Q:" / " A:".
  EXPECT_EQ(chat_prompt("Q: x? A: y\n\nQ: z? A:", "popqa", 1, "t").messages,
            turns({{"user", "Q: x? A:"}, {"assistant", "y"}, {"user", "Q: z? A:"}}));
}

TEST(GenerationTaskRegistry, MultipleChoiceRequestsInTheChatFormat) {
  // A chat-format object (truthfulqa::tulu's) and a plain context: rendered through the template, the continuation
  // without its leading space (no assistant prefix); the unconditional request keeps "Answer:" and its space, as
  // OLMES converts only chat-format contexts.
  TaskFiles f;
  f.task = "mmlu_anatomy";
  f.dir = "d";
  f.shots = 0;
  f.uncond_offset = 100;
  const nlohmann::json object = {{"messages", turns({{"user", "Q: a?\nA:"}})}, {"assistant_prefix", ""}};
  TaskRequest a{0, 0, 0, nullptr, object.dump(), " yes", object};
  TaskRequest b{1, 0, 0, nullptr, "Question: b?\nAnswer:", " \tno", nullptr};
  TaskRequest u{100, 0, 0, nullptr, "Answer:", " yes", nullptr};
  f.requests = {a, b, u};
  EXPECT_THROW(require_plain_contexts(f), Error);
  to_chat_format(f);
  require_plain_contexts(f);
  EXPECT_EQ(f.requests[0].context, archspace::chat_prompt_text(object["messages"], "t"));
  EXPECT_EQ(f.requests[0].continuation, "yes");
  EXPECT_EQ(f.requests[1].context, archspace::chat_prompt_text(turns({{"user", "Question: b?\nAnswer:"}}), "t"));
  EXPECT_EQ(f.requests[1].continuation, "no");
  EXPECT_EQ(f.requests[2].context, "Answer:");
  EXPECT_EQ(f.requests[2].continuation, " yes");
  // With an assistant prefix the continuation keeps its space.
  const nlohmann::json prefixed = {{"messages", turns({{"user", "Q"}})}, {"assistant_prefix", "A:"}};
  f.requests = {TaskRequest{0, 0, 0, nullptr, prefixed.dump(), " yes", prefixed}};
  to_chat_format(f);
  EXPECT_EQ(f.requests[0].context, archspace::chat_prompt_text(prefixed["messages"], "t") + "A:");
  EXPECT_EQ(f.requests[0].continuation, " yes");
}

TEST(PythonText, Utf8DecodesAndEncodesBack) {
  const std::string s = "h\xc3\xa9llo \xe2\x82\xac \xf0\x9d\x84\x9e";  // héllo € 𝄞
  const std::vector<char32_t> cps = text::decode_utf8(s);
  EXPECT_EQ(cps, (std::vector<char32_t>{'h', 0xE9, 'l', 'l', 'o', ' ', 0x20AC, ' ', 0x1D11E}));
  EXPECT_EQ(text::encode_utf8(cps), s);
  EXPECT_EQ(text::utf8_char_length(s, 1), 2u);
  EXPECT_EQ(text::utf8_char_length(s, 7), 3u);   // €
  EXPECT_EQ(text::utf8_char_length(s, 11), 4u);  // 𝄞
  EXPECT_EQ(text::decode_utf8("\xff"
                              "a"),
            (std::vector<char32_t>{0xFF, 'a'}));  // a stray byte kept as it is
}

TEST(PythonText, RegexSearchMatchAndFullMatchAsPython) {
  EXPECT_FALSE(text::regex("b").match("ab"));  // re.match: anchored at the start
  ASSERT_TRUE(text::regex("b").search("ab"));  // re.search: anywhere
  EXPECT_EQ(text::regex("b").search("ab")->start, 1u);
  EXPECT_TRUE(text::regex("a|ab").full_match("ab"));  // re.fullmatch backtracks into the second alternative
  EXPECT_FALSE(text::regex("(a)|(b)").search("b")->groups[1].has_value());
  EXPECT_EQ(text::last_group("(\\d+)", "1 and 22").value_or(""), "22");
  EXPECT_FALSE(text::last_group("\\d+", "none").has_value());
  EXPECT_EQ(text::py_regex_escape("a.b_c"), "a\\.b_c");
  testing::expect_error([] { text::regex("(unclosed"); }, {"regular expression \"(unclosed\""});
}

TEST(PythonText, StrSemantics) {
  EXPECT_EQ(text::py_lower("\xc4\xb0Stanbul"), "i\xcc\x87stanbul");  // 'İStanbul'.lower()
  EXPECT_EQ(text::py_capitalize("hELLO"), "Hello");
  EXPECT_EQ(text::py_strip("\xc2\xa0 a b \x1f"), "a b");      // NBSP and \x1f are whitespace to Python
  EXPECT_EQ(text::py_lstrip("\xe3\x80\x80\n a b "), "a b ");  // U+3000 too
  EXPECT_EQ(text::py_rstrip(" a b\xe2\x80\xa8\t"), " a b");   // U+2028
  EXPECT_EQ(text::py_rstrip("a\xff "), "a\xff");  // a byte that starts no character stays, as it is not whitespace
  EXPECT_EQ(text::py_split(" a  b\tc "), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(text::join_words({"a", "b"}), "a b");
  EXPECT_EQ(text::remove_punctuation("a.b,c!"), "abc");
  std::string s = "aXbXc";
  text::replace_all(s, "X", "--");
  EXPECT_EQ(s, "a--b--c");
  EXPECT_EQ(text::py_float_repr("1_000.50"), "1000.5");
  EXPECT_FALSE(text::py_is_float("1__0"));
}

}  // namespace
}  // namespace archspace
