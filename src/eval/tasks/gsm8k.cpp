// gsm8k: exact_match (primary) on OLMES' answer, the last number of the generation; exact_match_flex on lm-eval's
// "flexible-extract" filter. Both compared with the gold by lm-eval's exact_match with the task config's
// metric_kwargs (regexes_to_ignore, ignore_case).
#include "archspace/eval/tasks/gsm8k.h"

#include "archspace/eval/task_family_registration.h"

namespace archspace {

namespace genmetrics {

const std::vector<std::string> kGsm8kRegexesToIgnore = {",", "\\$", "(?s).*#### ", "\\.$"};

std::string gsm8k_last_number(const std::string& generation) {
  const std::string text = text::regex_sub("(\\d),(\\d)", "\\1\\2", generation);
  const std::vector<text::Match> numbers = text::regex("[-+]?\\d*\\.\\d+|\\d+").find_all(text);
  return numbers.empty() ? text : *numbers.back().groups[0];
}

std::string gsm8k_flex(const std::string& generation) {
  return text::regex_filter("(-?[$0-9.,]{2,})|(-?[0-9]+)", -1, "[invalid]", generation);
}

}  // namespace genmetrics

namespace task_families {
namespace {

class Gsm8k final : public GenerationTaskFamily {
 public:
  std::vector<GenerationTaskSpec> tasks() const override {
    return {{"gsm8k", "", {"exact_match", "exact_match_flex"}, "exact_match"}};
  }
  void check_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) const override {
    check_string_gold(spec, gold);
  }
  void score(const std::vector<const GenerationInstance*>& batch, const ExternalScorers&,
             const std::vector<InstanceMetrics*>& out) const override {
    score_each(batch, out, [](const GenerationInstance& x, InstanceMetrics& m) {
      const std::string gold = x.gold.get<std::string>();
      const auto em = [&](const std::string& answer) {
        return genmetrics::exact_match(answer, gold, genmetrics::kGsm8kRegexesToIgnore, /*ignore_case=*/true,
                                       /*ignore_punctuation=*/false)
                   ? 1.0
                   : 0.0;
      };
      set_metric(m, "exact_match", em(genmetrics::gsm8k_last_number(x.generation)));
      set_metric(m, "exact_match_flex", em(genmetrics::gsm8k_flex(x.generation)));
    });
  }
  // gsm8k::tulu (olmes oe_eval/configs/tasks.py:5678) is use_chat_format with fewshot_as_multiturn, and GSM8K's
  // chat_overrides (olmes oe_eval/tasks/oe_eval_tasks/gsm8k.py:75-79) set assistant_prefix "Answer:": each user turn
  // "Question: ..." without its "\nAnswer:", each assistant turn "Answer: <solution>", the prompt ending in
  // "Answer:" after the generation prompt.
  std::optional<ChatSettings> chat_settings(const std::string&) const override { return ChatSettings{true, "Answer:"}; }
};

}  // namespace

ARCHSPACE_GENERATION_TASK_FAMILY(gsm8k, Gsm8k, 10)

}  // namespace task_families
}  // namespace archspace
