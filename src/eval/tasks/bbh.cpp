// bbh_<subtask> (the 27 of OLMES' BBH_TASKS, the group bbh): exact_match (primary) and exact_match_simple, OLMES'
// bbh:cot-v1::tulu (answer_extract_fn "answer_regex", GenericBBH._extract_answer_regex): the subtask's answer
// pattern (MC: "(X)") tried after "So the answer is", "answer is", "answer:", "answer", alone, (MC) a bare capital,
// then case-insensitively, the last match of the first pattern that matches; delimiters ($ $, ( ), ** **, [ ],
// quotes) stripped; a bare MC letter becomes "(X)". exact_match: lm-eval's exact_match with ignore_case and
// ignore_punctuation (not for dyck_languages, whose answers are punctuation); exact_match_simple: equal strings.
// exact_match_corrected: exact_match with the bare-capital pattern a real word boundary (see below), not OLMES'.
#include "archspace/eval/tasks/bbh.h"

#include <map>

#include "archspace/eval/task_family_registration.h"
#include "archspace/text/utf8.h"
#include "archspace/util/error.h"

namespace archspace {

namespace genmetrics {

namespace {

// OLMES' BBH_ANSWER_REGEX (oe_eval/data/bbh_tasks.py): the answer's shape per subtask; "MC" a lettered choice.
const std::map<std::string, std::string>& bbh_patterns() {
  static const std::map<std::string, std::string> m = {
      {"boolean_expressions", "[tT]rue|[fF]alse"},
      {"causal_judgement", "[yY]es|[nN]o"},
      {"date_understanding", "MC"},
      {"disambiguation_qa", "MC"},
      {"dyck_languages", "[\\]\\)\\}\\> ]+"},
      {"formal_fallacies", "[iI]nvalid|[vV]alid"},
      {"geometric_shapes", "MC"},
      {"hyperbaton", "MC"},
      {"logical_deduction_five_objects", "MC"},
      {"logical_deduction_seven_objects", "MC"},
      {"logical_deduction_three_objects", "MC"},
      {"movie_recommendation", "MC"},
      {"multistep_arithmetic_two", "-?\\d+"},
      {"navigate", "[nN]o|[yY]es"},
      {"object_counting", "\\d+"},
      {"penguins_in_a_table", "MC"},
      {"reasoning_about_colored_objects", "MC"},
      {"ruin_names", "MC"},
      {"salient_translation_error_detection", "MC"},
      {"snarks", "MC"},
      {"sports_understanding", "[yY]es|[nN]o"},
      {"temporal_sequences", "MC"},
      {"tracking_shuffled_objects_five_objects", "MC"},
      {"tracking_shuffled_objects_seven_objects", "MC"},
      {"tracking_shuffled_objects_three_objects", "MC"},
      {"web_of_lies", "[yY]es|[nN]o"},
      {"word_sorting", "[a-z ]+"},
  };
  return m;
}

}  // namespace

const std::string& bbh_answer_pattern(const std::string& subtask) {
  const auto it = bbh_patterns().find(subtask);
  if (it == bbh_patterns().end()) throw Error("unknown BBH subtask \"" + subtask + "\"");
  return it->second;
}

std::string bbh_extract_answer(const std::string& generation, const std::string& subtask, bool corrected) {
  std::string answer_regex = bbh_answer_pattern(subtask);
  const bool mc = answer_regex == "MC";
  if (mc) answer_regex = "\\([A-Z]\\)";
  std::vector<std::string> templates = {"(?i)So the answer is ($ANS$)\\.?", "(?i)answer is ($ANS$)",
                                        "(?i)answer:.*?($ANS$)", "(?i)answer\\b.*?($ANS$)", "($ANS$)"};
  // OLMES appends this "last resort" as the non-raw Python string "\b([A-Z])\b" (olmes 99cf8bb7,
  // oe_eval/tasks/oe_eval_tasks/bbh.py:236): its \b are backspace characters, so a bare option letter never matches
  // there. The published numbers are OLMES' as it runs, so the pattern is kept as OLMES compiles it; the corrected
  // variant has the word boundaries the comment there means (a raw string).
  if (mc) templates.push_back(corrected ? "\\b([A-Z])\\b" : "\x08([A-Z])\x08");
  templates.push_back("(?i)($ANS$)");
  std::string extracted;
  for (std::string t : templates) {
    text::replace_all(t, "$ANS$", answer_regex);
    if (const auto found = text::last_group(t, generation)) {
      extracted = *found;
      break;
    }
  }
  // Surrounding delimiters, each pair in turn, unless the answer itself may start with it.
  static const std::vector<std::pair<std::string, std::string>> delimiters = {
      {"$", "$"},     {"\\(", "\\)"}, {"(", ")"}, {"**", "**"}, {"***", "***"},
      {"\\[", "\\]"}, {"'", "'"},     {"`", "`"}, {"\"", "\""}};
  for (const auto& [left, right] : delimiters) {
    if (text::regex(answer_regex).match(left, 0)) continue;  // re.match(answer_regex, left)
    std::string pattern = "^";  // appended piecewise: GCC 12 misreads "^" + a returned string as an overflow
    pattern += text::py_regex_escape(left);
    pattern += "(.*)";
    pattern += text::py_regex_escape(right);
    pattern += "$";
    extracted = text::py_strip(text::regex_sub(pattern, "\\1", extracted));
  }
  if (mc && text::decode_utf8(extracted).size() == 1) extracted = "(" + extracted + ")";
  return extracted;
}

}  // namespace genmetrics

namespace task_families {
namespace {

const std::string kPrefix = "bbh_";

// OLMES' BBH_TASKS (oe_eval/data/*, as its task suites oe_eval/configs/task_suites.py use them): the group bbh.
std::vector<std::string> subtask_tasks() {
  std::vector<std::string> v;
  for (const char* subtask : {"boolean_expressions",
                              "causal_judgement",
                              "date_understanding",
                              "disambiguation_qa",
                              "dyck_languages",
                              "formal_fallacies",
                              "geometric_shapes",
                              "hyperbaton",
                              "logical_deduction_five_objects",
                              "logical_deduction_seven_objects",
                              "logical_deduction_three_objects",
                              "movie_recommendation",
                              "multistep_arithmetic_two",
                              "navigate",
                              "object_counting",
                              "penguins_in_a_table",
                              "reasoning_about_colored_objects",
                              "ruin_names",
                              "salient_translation_error_detection",
                              "snarks",
                              "sports_understanding",
                              "temporal_sequences",
                              "tracking_shuffled_objects_five_objects",
                              "tracking_shuffled_objects_seven_objects",
                              "tracking_shuffled_objects_three_objects",
                              "web_of_lies",
                              "word_sorting"})
    v.push_back(std::string("bbh_") + subtask);
  return v;
}

class Bbh final : public GenerationTaskFamily {
 public:
  std::vector<GenerationTaskSpec> tasks() const override {
    std::vector<GenerationTaskSpec> v;
    for (const auto& t : subtask_tasks())
      v.push_back({t, "bbh", {"exact_match", "exact_match_simple", "exact_match_corrected"}, "exact_match"});
    return v;
  }
  // Its suite bbh:cot-v1::tulu reports the micro average.
  std::vector<TaskGroup> groups() const override { return {{"bbh", subtask_tasks(), "micro", ""}}; }
  void check_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) const override {
    check_string_gold(spec, gold);
  }
  void score(const std::vector<const GenerationInstance*>& batch, const ExternalScorers&,
             const std::vector<InstanceMetrics*>& out) const override {
    score_each(batch, out, [](const GenerationInstance& x, InstanceMetrics& m) {
      const std::string subtask = x.task.substr(kPrefix.size());
      const std::string gold = x.gold.get<std::string>();
      // OLMES' ExactMatch (oe_eval/metrics/metric.py:536-550; bbh.py:114 and 121-128 set its options).
      const auto em = [&](const std::string& answer) {
        return genmetrics::exact_match(answer, gold, {}, /*ignore_case=*/true,
                                       /*ignore_punctuation=*/subtask != "dyck_languages")
                   ? 1.0
                   : 0.0;
      };
      const std::string answer = genmetrics::bbh_extract_answer(x.generation, subtask);
      const std::string corrected = genmetrics::bbh_extract_answer(x.generation, subtask, /*corrected=*/true);
      set_metric(m, "exact_match", em(answer));
      set_metric(m, "exact_match_simple", answer == gold ? 1.0 : 0.0);
      set_metric(m, "exact_match_corrected", em(corrected));
    });
  }
  // OLMES' bbh CoT query "Q: <input>\nA: Let's think step by step." and target " <solution>" (olmes
  // oe_eval/tasks/oe_eval_tasks/bbh.py:156-170, 192-194): under fewshot_as_multiturn (bbh.py:100-107) the user turn
  // ends with "Let's think step by step." and the assistant turn is the solution.
  std::optional<FewShotMarkers> few_shot_markers(const std::string&) const override {
    return FewShotMarkers{"Q:", "\nA: Let's think step by step."};
  }
};

}  // namespace

ARCHSPACE_GENERATION_TASK_FAMILY(bbh, Bbh, 60)

}  // namespace task_families
}  // namespace archspace
