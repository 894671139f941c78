// minerva_math_{algebra, counting_and_probability, geometry, intermediate_algebra, number_theory, prealgebra,
// precalculus} (the group minerva_math) and minerva_math_500: exact_match as OLMES' minerva_math::tulu computes it
// (olmes 99cf8bb7, oe_eval/tasks/oe_eval_tasks/minerva_math.py:243-258, cot_style "minerva": lm-eval's minerva
// process_results). OLMES pins lm_eval==0.4.3 (pyproject.toml:27), so the functions it runs are 0.4.3's:
// get_unnormalized_answer, 0.4.3's normalize_final_answer (here in C++), then 0.4.3's is_equiv, which has no
// shortcut for identical strings (an answer identical to the gold that sympy cannot parse, a tuple or an interval,
// scores 0), so every pair goes to the caller's AnswerEquivalence. OLMES' golds (the request files' label) were
// normalised by the same 0.4.3 function, so its bugs ("ft" removed from "\left", the tuple "0,1" fused into "01")
// hit both sides alike; a variant with lm-eval 0.4.13's corrected normalisation would need the gold re-derived from
// the solution, and is not reported.
#include "archspace/eval/tasks/minerva_math.h"

#include <algorithm>
#include <map>

#include "archspace/eval/task_family_registration.h"
#include "archspace/eval/task_files.h"
#include "archspace/olmes_fewshot.h"
#include "archspace/util/error.h"

namespace archspace {

namespace genmetrics {

std::string minerva_unnormalized_answer(const std::string& generation) {
  const std::optional<text::Match> m = text::regex("Final Answer: The final answer is(.*?). I hope it is correct.")
                                           .search(generation + "I hope it is correct.", 0);
  return m ? text::py_strip(m->groups[1].value_or("")) : "[invalidanswer]";
}

namespace {

using text::regex_sub;
using text::replace_all;

// lm-eval 0.4.3's SUBSTITUTIONS and REMOVED_EXPRESSIONS (utils.py:201-256; 0.4.13 has the same lists).
const std::vector<std::pair<std::string, std::string>>& substitutions() {
  static const std::vector<std::pair<std::string, std::string>> v = {
      {"an ", ""}, {"a ", ""},       {".$", "$"},           {"\\$", ""},          {"\\ ", ""},
      {" ", ""},   {"mbox", "text"}, {",\\text{and}", ","}, {"\\text{and}", ","}, {"\\text{m}", "\\text{}"}};
  return v;
}

const std::vector<std::string>& removed_expressions() {
  static const std::vector<std::string> v = {"square",       "ways",
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
  return v;
}

// After the last "=" (str.split("=")[-1]).
std::string after_last_equals(const std::string& answer) {
  const size_t eq = answer.rfind('=');
  return eq == std::string::npos ? answer : answer.substr(eq + 1);
}

// The LaTeX wrappers unwrapped, \fracab braced (utils.py:274-286).
std::string unwrap_latex(std::string s) {
  s = regex_sub("(.*?)(\\$)(.*?)(\\$)(.*)", "$\\3$", s);
  s = regex_sub("(\\\\text\\{)(.*?)(\\})", "\\2", s);
  s = regex_sub("(\\\\textbf\\{)(.*?)(\\})", "\\2", s);
  s = regex_sub("(\\\\overline\\{)(.*?)(\\})", "\\2", s);
  s = regex_sub("(\\\\boxed\\{)(.*)(\\})", "\\2", s);
  return regex_sub("(frac)([^{])(.)", "frac{\\2}{\\3}", s);
}

// Python's str.isdigit: not empty, every character a decimal digit (\d, Unicode Nd) or another digit
// (Numeric_Type=Digit: superscripts, circled and parenthesised digits, ...; the ranges of Python 3.11's
// Unicode 14 tables).
bool py_isdigit(const std::string& s) {
  static const text::Regex digits(
      "[\\d\\x{B2}-\\x{B3}\\x{B9}\\x{1369}-\\x{1371}\\x{19DA}\\x{2070}\\x{2074}-\\x{2079}\\x{2080}-\\x{2089}"
      "\\x{2460}-\\x{2468}\\x{2474}-\\x{247C}\\x{2488}-\\x{2490}\\x{24EA}\\x{24F5}-\\x{24FD}\\x{24FF}"
      "\\x{2776}-\\x{277E}\\x{2780}-\\x{2788}\\x{278A}-\\x{2792}\\x{10A40}-\\x{10A43}\\x{10E60}-\\x{10E68}"
      "\\x{11052}-\\x{1105A}\\x{1F100}-\\x{1F10A}]+");
  return digits.full_match(s);
}

}  // namespace

std::string minerva_normalize_final_answer(const std::string& answer) {
  // lm-eval 0.4.3 lm_eval/tasks/minerva_math/utils.py:259-294, which OLMES runs: every substitution, then every
  // removed expression as a plain str.replace (so "ft" also goes out of "\left", utils.py:270), the LaTeX
  // unwrapping, the one-rule \sqrt shorthand (utils.py:287), and the commas dropped whenever the rest is digits
  // (utils.py:291, so the tuple "0,1" becomes "01").
  std::string s = after_last_equals(answer);
  for (const auto& [before, after] : substitutions()) replace_all(s, before, after);
  for (const auto& expr : removed_expressions()) replace_all(s, expr, "");
  s = unwrap_latex(s);
  s = regex_sub("(sqrt)([^{])", "sqrt{\\2}", s);
  replace_all(s, "$", "");
  std::string no_commas = s;
  replace_all(no_commas, ",", "");
  return py_isdigit(no_commas) ? no_commas : s;
}

}  // namespace genmetrics

namespace task_families {
namespace {

// OLMES' MATH_TASK_TYPES (oe_eval/data/*, as its task suites oe_eval/configs/task_suites.py use them): the group
// minerva_math.
std::vector<std::string> subject_tasks() {
  std::vector<std::string> v;
  for (const char* subject : {"algebra", "counting_and_probability", "geometry", "intermediate_algebra",
                              "number_theory", "prealgebra", "precalculus"})
    v.push_back(std::string("minerva_math_") + subject);
  return v;
}

// OLMES' "Minerva:MATH" few-shot source (src/eval/tasks/olmes_fewshot/minerva_math.json, with its provenance): the
// default of minerva_math.py's TASK_CONFIG_DEFAULTS, which the ::tulu specs keep. The installed files were rendered
// from "Minerva:MATH:fixed" (the ::olmes specs'), whose 4th example has other line breaks.
const std::vector<std::pair<std::string, std::string>>& tulu_shots() {
  static const auto shots = [] {
    std::vector<std::pair<std::string, std::string>> v;
    const nlohmann::json sources = nlohmann::json::parse(kMinervaMathFewshotJson);  // outlives the loop below
    for (const auto& shot : sources.at("Minerva:MATH"))
      v.emplace_back(shot.at("problem").get<std::string>(), shot.at("solution").get<std::string>());
    return v;
  }();
  return shots;
}

// minerva_math.py _process_doc with cot_style "minerva": the query of a problem.
std::string minerva_query(const std::string& problem) { return "Problem:\n" + problem + "\n\nSolution:"; }

// The plain context OLMES' fewshot_context builds for minerva_math_<subject>::tulu (base_task.py: the shots'
// doc_to_text + doc_to_target joined by blank lines, then the document's doc_to_text; doc_to_target is " " + the
// solution, use_cot): the installed line's document after the four "Minerva:MATH" shots. The line's own context
// must end with that document's query, so that a file of another task is not silently re-rendered.
std::string tulu_context(const nlohmann::json& line, const std::string& where) {
  const nlohmann::json& doc = json_field(line, "doc", where);
  const std::string query = minerva_query(json_string_field(doc, "problem", where + " doc"));
  const std::string& context = line["request"]["context"].get_ref<const std::string&>();
  if (!context.ends_with(query))
    throw Error(where + ": request.context does not end with its document's problem (\"Problem:\\n\" + doc.problem + " +
                "\"\\n\\nSolution:\"), so --chat cannot render it as minerva_math::tulu");
  std::string text;
  for (const auto& [problem, solution] : tulu_shots()) text += minerva_query(problem) + " " + solution + "\n\n";
  return text + query;
}

class MinervaMath final : public GenerationTaskFamily {
 public:
  // Under --chat a plain line of a subject rendered from "Minerva:MATH:fixed" (the ::olmes specs', the installed
  // files: their config's fewshot_source) becomes minerva_math_<subject>::tulu's request (olmes
  // oe_eval/configs/tasks.py, the ::tulu loop over MATH_TASK_TYPES): the "Minerva:MATH" shots as turns
  // (fewshot_as_multiturn), and its generation_kwargs' stop_sequences [] ("we rely on the chat format to provide
  // the stop sequence"; max_gen_toks 1024, greedy, as the files have). Other files (chat-format ones, plain ones of
  // another source) and minerva_math_500 are read as they are.
  GenerationPrompt read_prompt(const nlohmann::json& line, const RequestFile& file,
                               const std::string& where) const override {
    const auto subjects = subject_tasks();
    const bool plain = line.is_object() && line.contains("request") && line["request"].is_object() &&
                       line["request"].contains("context") && line["request"]["context"].is_string();
    const bool fixed = file.task_config.is_object() && file.task_config.contains("fewshot_source") &&
                       file.task_config["fewshot_source"] == "Minerva:MATH:fixed";
    if (!file.chat || !plain || !fixed || std::find(subjects.begin(), subjects.end(), file.task) == subjects.end())
      return GenerationTaskFamily::read_prompt(line, file, where);
    nlohmann::json tulu = line;
    tulu["request"]["context"] = tulu_context(line, where);
    tulu["request"]["stop_sequences"] = nlohmann::json::array();
    const RequestFile shots{file.task, file.task_config, file.config_path, static_cast<int64_t>(tulu_shots().size()),
                            file.chat};
    return GenerationTaskFamily::read_prompt(tulu, shots, where);
  }
  std::vector<GenerationTaskSpec> tasks() const override {
    std::vector<GenerationTaskSpec> v;
    for (const auto& t : subject_tasks()) v.push_back({t, "minerva_math", {"exact_match"}, "exact_match"});
    v.push_back({"minerva_math_500", "", {"exact_match"}, "exact_match"});
    return v;
  }
  std::vector<TaskGroup> groups() const override { return {{"minerva_math", subject_tasks(), "macro", ""}}; }
  void check_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) const override {
    check_string_gold(spec, gold);
  }
  void score(const std::vector<const GenerationInstance*>& batch, const ExternalScorers& scorers,
             const std::vector<InstanceMetrics*>& out) const override {
    // Every pair goes to the equivalence check (OLMES' is_equiv: lm-eval 0.4.3, no identical-string shortcut)
    // together, each distinct pair once.
    std::map<std::pair<std::string, std::string>, std::vector<InstanceMetrics*>> pending;
    score_each(batch, out, [&](const GenerationInstance& x, InstanceMetrics& m) {
      const std::string answer =
          genmetrics::minerva_normalize_final_answer(genmetrics::minerva_unnormalized_answer(x.generation));
      pending[{answer, x.gold.get<std::string>()}].push_back(&m);
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
  ExternalScorer external_scorer() const override { return ExternalScorer::answer_equivalence; }
  std::optional<FewShotMarkers> few_shot_markers(const std::string&) const override {
    return FewShotMarkers{"Problem:", "\n\nSolution:"};
  }
};

}  // namespace

ARCHSPACE_GENERATION_TASK_FAMILY(minerva_math, MinervaMath, 20)

}  // namespace task_families
}  // namespace archspace
