// popqa: exact_match, OLMES' PopQA alias match (olmes 99cf8bb7, oe_eval/tasks/oe_eval_tasks/popqa.py:160-180): some
// gold alias a occurs in the generation as a, a.lower() or a.capitalize() (Python's; an empty alias occurs in every
// generation, as in Python). Gold: doc.alias, else the request's label, else doc.possible_answers.
#include "archspace/eval/tasks/popqa.h"

#include "archspace/eval/task_family_registration.h"
#include "archspace/util/error.h"
#include "archspace/util/json_file.h"

namespace archspace {

namespace genmetrics {

bool popqa_match(const std::string& generation, const std::vector<std::string>& aliases) {
  for (const auto& a : aliases) {
    for (const std::string& form : {a, text::py_lower(a), text::py_capitalize(a)}) {
      if (generation.find(form) != std::string::npos) return true;
    }
  }
  return false;
}

}  // namespace genmetrics

namespace task_families {
namespace {

class PopQa final : public GenerationTaskFamily {
 public:
  std::vector<GenerationTaskSpec> tasks() const override { return {{"popqa", "", {"exact_match"}, "exact_match"}}; }
  void check_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) const override {
    check_strings_gold(spec, gold);
  }
  // doc.alias when the line has it: OLMES scores against it, not the label (olmes 99cf8bb7,
  // oe_eval/tasks/oe_eval_tasks/popqa.py:170; its files' label is the same list, popqa.py:86). Else the label, else
  // doc.possible_answers (a list, or the JSON text of one as the HF dataset stores it).
  nlohmann::json gold_from_request(const GenerationTaskSpec& spec, const nlohmann::json& line) const override {
    const nlohmann::json* doc =
        line.is_object() && line.contains("doc") && line["doc"].is_object() ? &line["doc"] : nullptr;
    if (doc && doc->contains("alias")) return checked_gold_field(spec, &(*doc)["alias"], "doc.alias");
    if (!doc || !doc->contains("possible_answers") ||
        (line.contains("label") && (line["label"].is_string() || line["label"].is_array())))
      return GenerationTaskFamily::gold_from_request(spec, line);
    nlohmann::json answers = (*doc)["possible_answers"];
    if (answers.is_string()) {
      check_json_depth(answers.get<std::string>(), "field \"doc.possible_answers\"");
      answers = nlohmann::json::parse(answers.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (answers.is_discarded()) throw Error("field \"doc.possible_answers\": a string that is not a JSON list");
    }
    try {
      check_gold(spec, answers);
    } catch (const Error& e) {
      throw Error(std::string("field \"doc.possible_answers\": ") + e.what());
    }
    return answers;
  }
  void score(const std::vector<const GenerationInstance*>& batch, const ExternalScorers&,
             const std::vector<InstanceMetrics*>& out) const override {
    score_each(batch, out, [](const GenerationInstance& x, InstanceMetrics& m) {
      set_metric(m, "exact_match", genmetrics::popqa_match(x.generation, strings_gold(x.gold)) ? 1.0 : 0.0);
    });
  }
  // OLMES' PopQA.doc_to_text "Q: <query> A:" and doc_to_target " <gold>" (olmes
  // oe_eval/tasks/oe_eval_tasks/popqa.py:110-116); popqa::tulu (tasks.py:7105) is fewshot_as_multiturn, no prefix.
  std::optional<FewShotMarkers> few_shot_markers(const std::string&) const override {
    return FewShotMarkers{"Q:", " A:"};
  }
};

}  // namespace

ARCHSPACE_GENERATION_TASK_FAMILY(popqa, PopQa, 70)

}  // namespace task_families
}  // namespace archspace
