// naturalqs_open, squad, coqa, jeopardy: f1 (primary), exact_match and recall, OLMES' SQuADF1EMRecallMetric
// (SQuAD v1.1 normalisation: lower case, ASCII punctuation and the articles a/an/the removed, whitespace collapsed;
// max over the gold answers; recall: some gold, stripped and lower-cased, occurs in the generation).
#include "archspace/eval/tasks/qa.h"

#include <algorithm>
#include <map>

#include "archspace/eval/task_family_registration.h"

namespace archspace {

namespace genmetrics {

std::string squad_normalize(const std::string& s) {
  std::string t = text::remove_punctuation(text::py_lower(s));
  t = text::regex_sub("\\b(a|an|the)\\b", " ", t);
  return text::join_words(text::py_split(t));
}

double squad_f1(const std::string& prediction, const std::string& gold) {
  const std::vector<std::string> p = text::py_split(squad_normalize(prediction)),
                                 g = text::py_split(squad_normalize(gold));
  std::map<std::string, int64_t> counts;
  for (const auto& w : p) ++counts[w];
  int64_t common = 0;
  for (const auto& w : g) {
    auto it = counts.find(w);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++common;
    }
  }
  if (common == 0) return 0.0;
  const double precision = static_cast<double>(common) / p.size(), recall = static_cast<double>(common) / g.size();
  return 2 * precision * recall / (precision + recall);
}

double squad_em(const std::string& prediction, const std::string& gold) {
  return squad_normalize(prediction) == squad_normalize(gold) ? 1.0 : 0.0;
}

double olmes_recall(const std::string& prediction, const std::vector<std::string>& golds) {
  const std::string p = text::py_lower(text::py_strip(prediction));
  for (const auto& g : golds) {
    if (p.find(text::py_lower(text::py_strip(g))) != std::string::npos) return 1.0;
  }
  return 0.0;
}

}  // namespace genmetrics

namespace task_families {
namespace {

class QuestionAnswering final : public GenerationTaskFamily {
 public:
  std::vector<GenerationTaskSpec> tasks() const override {
    std::vector<GenerationTaskSpec> v;
    for (const char* t : {"naturalqs_open", "squad", "coqa", "jeopardy"})
      v.push_back({t, "", {"f1", "exact_match", "recall"}, "f1"});
    return v;
  }
  void check_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) const override {
    check_strings_gold(spec, gold);
  }
  void score(const std::vector<const GenerationInstance*>& batch, const ExternalScorers&,
             const std::vector<InstanceMetrics*>& out) const override {
    score_each(batch, out, [](const GenerationInstance& x, InstanceMetrics& m) {
      const std::vector<std::string> golds = strings_gold(x.gold);
      double f1 = 0, em = 0;
      for (const auto& g : golds) {
        f1 = std::max(f1, genmetrics::squad_f1(x.generation, g));
        em = std::max(em, genmetrics::squad_em(x.generation, g));
      }
      set_metric(m, "f1", f1);
      set_metric(m, "exact_match", em);
      set_metric(m, "recall", genmetrics::olmes_recall(x.generation, golds));
    });
  }
  // OLMES' few-shot formats: squad's shots open with the title, jeopardy's with the category.
  std::optional<FewShotMarkers> few_shot_markers(const std::string& task) const override {
    if (task == "squad") return FewShotMarkers{"Title:", "\nAnswer:"};
    if (task == "jeopardy") return FewShotMarkers{"Category:", "\nAnswer:"};
    return std::nullopt;
  }
};

}  // namespace

ARCHSPACE_GENERATION_TASK_FAMILY(qa, QuestionAnswering, 40)

}  // namespace task_families
}  // namespace archspace
