// minerva_math_{algebra, counting_and_probability, geometry, intermediate_algebra, number_theory, prealgebra,
// precalculus} (the group minerva_math) and minerva_math_500: exact_match, lm-eval's get_unnormalized_answer and
// normalize_final_answer here, then is_equiv(answer, gold) by the caller's AnswerEquivalence for the pairs that are
// not equal as strings (it needs sympy).
#include <algorithm>
#include <map>

#include "archspace/util/error.h"
#include "families.h"

namespace archspace {

namespace genmetrics {

std::string minerva_unnormalized_answer(const std::string& generation) {
  const std::optional<text::Match> m = text::regex("Final Answer: The final answer is(.*?). I hope it is correct.")
                                           .search(generation + "I hope it is correct.", 0);
  return m ? text::py_strip(m->groups[1].value_or("")) : "[invalidanswer]";
}

std::string minerva_normalize_final_answer(const std::string& answer) {
  using text::regex_sub;
  using text::replace_all;
  static const std::vector<std::pair<std::string, std::string>> substitutions = {
      {"an ", ""}, {"a ", ""},       {".$", "$"},           {"\\$", ""},          {"\\ ", ""},
      {" ", ""},   {"mbox", "text"}, {",\\text{and}", ","}, {"\\text{and}", ","}, {"\\text{m}", "\\text{}"}};
  static const std::vector<std::string> removed = {"square",       "ways",
                                                   "integers",     "dollars",
                                                   "mph",          "inches",
                                                   "ft",           "hours",
                                                   "km",           "units",
                                                   "\\ldots",      "sue",
                                                   "points",       "feet",
                                                   "minutes",      "digits",
                                                   "cents",        "degrees",
                                                   "cm",           "gm",
                                                   "pounds",       "meters",
                                                   "meals",        "edges",
                                                   "students",     "childrentickets",
                                                   "multiples",    "\\text{s}",
                                                   "\\text{.}",    "\\text{\ns}",
                                                   "\\text{}^2",   "\\text{}^3",
                                                   "\\text{\n}",   "\\text{}",
                                                   "\\mathrm{th}", "^\\circ",
                                                   "^{\\circ}",    "\\;",
                                                   ",\\!",         "{,}",
                                                   "\"",           "\\dots"};
  const auto is_alpha = [](const std::string& w) {
    return !w.empty() && std::all_of(w.begin(), w.end(), [](char c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; });
  };
  std::string s = answer.substr(answer.rfind('=') == std::string::npos ? 0 : answer.rfind('=') + 1);
  for (const auto& expr : removed) {
    if (is_alpha(expr)) s = regex_sub("(?<!\\\\)\\b" + expr + "\\b", "", s);
  }
  for (const auto& [before, after] : substitutions) replace_all(s, before, after);
  for (const auto& expr : removed) {
    if (is_alpha(expr)) {
      // re.split on LaTeX command names: the text between them loses the unit, the commands are kept.
      std::string out;
      size_t last = 0;
      for (const text::Match& m : text::regex("(\\\\[a-zA-Z]+)").find_all(s)) {
        std::string segment = s.substr(last, m.start - last);
        replace_all(segment, expr, "");
        out += segment + *m.groups[0];
        last = m.end;
      }
      std::string segment = s.substr(last);
      replace_all(segment, expr, "");
      s = out + segment;
    } else {
      replace_all(s, expr, "");
    }
  }
  s = regex_sub("(.*?)(\\$)(.*?)(\\$)(.*)", "$\\3$", s);
  s = regex_sub("(\\\\text\\{)(.*?)(\\})", "\\2", s);
  s = regex_sub("(\\\\textbf\\{)(.*?)(\\})", "\\2", s);
  s = regex_sub("(\\\\overline\\{)(.*?)(\\})", "\\2", s);
  s = regex_sub("(\\\\boxed\\{)(.*)(\\})", "\\2", s);
  s = regex_sub("(frac)([^{])(.)", "frac{\\2}{\\3}", s);
  s = regex_sub("(sqrt)(\\[[^\\]]*\\])(\\w)", "\\1\\2{\\3}", s);
  s = regex_sub("(sqrt)(?!\\[)([^{])", "sqrt{\\2}", s);
  replace_all(s, "$", "");
  if (text::regex("-?\\d{1,3}(,\\d{3})+").full_match(s)) replace_all(s, ",", "");
  return s;
}

}  // namespace genmetrics

namespace task_families {
namespace {

class MinervaMath final : public GenerationTaskFamily {
 public:
  std::vector<GenerationTaskSpec> tasks() const override {
    std::vector<GenerationTaskSpec> v;
    for (const char* subject : {"algebra", "counting_and_probability", "geometry", "intermediate_algebra",
                                "number_theory", "prealgebra", "precalculus"})
      v.push_back({std::string("minerva_math_") + subject, "minerva_math", {"exact_match"}, "exact_match"});
    v.push_back({"minerva_math_500", "", {"exact_match"}, "exact_match"});
    return v;
  }
  void check_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) const override {
    check_string_gold(spec, gold);
  }
  void score(const std::vector<const GenerationInstance*>& batch, const ExternalScorers& scorers,
             const std::vector<InstanceMetrics*>& out) const override {
    // The pairs whose strings differ go to the equivalence check together, each distinct pair once.
    std::map<std::pair<std::string, std::string>, std::vector<InstanceMetrics*>> pending;
    score_each(batch, out, [&](const GenerationInstance& x, InstanceMetrics& m) {
      const std::string answer =
          genmetrics::minerva_normalize_final_answer(genmetrics::minerva_unnormalized_answer(x.generation));
      const std::string gold = x.gold.get<std::string>();
      if (!answer.empty() && answer == gold) {
        set_metric(m, "exact_match", 1.0);  // is_equiv's own first test: identical non-empty strings
      } else {
        pending[{answer, gold}].push_back(&m);
      }
    });
    if (pending.empty()) return;
    if (!scorers.equivalence)
      throw Error("Minerva MATH answers need an equivalence check (is_equiv), and none was given");
    std::vector<std::pair<std::string, std::string>> pairs;
    for (const auto& [pair, users] : pending) pairs.push_back(pair);
    const std::vector<bool> equal = scorers.equivalence(pairs);
    if (equal.size() != pairs.size())
      throw Error("the equivalence check answered " + std::to_string(equal.size()) + " pairs for " +
                  std::to_string(pairs.size()));
    size_t k = 0;
    for (const auto& [pair, users] : pending) {
      for (InstanceMetrics* m : users) set_metric(*m, "exact_match", equal[k] ? 1.0 : 0.0);
      ++k;
    }
  }
  bool needs_external_scorer() const override { return true; }
  std::optional<FewShotMarkers> few_shot_markers(const std::string&) const override {
    return FewShotMarkers{"Problem:", "\n\nSolution:"};
  }
};

}  // namespace

const GenerationTaskFamily& minerva_math() {
  static const MinervaMath family;
  return family;
}

}  // namespace task_families
}  // namespace archspace
