// drop: f1 (primary) and exact_match, the official DROP metric as lm-eval's drop/utils.py computes it (the
// generation is one predicted span; max over the gold answers, each a list of spans, the spans aligned by an
// optimal assignment; F1 rounded to 2 decimals as numpy rounds). Gold: the request's doc.answers.
#include "archspace/eval/tasks/drop.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "archspace/eval/task_family_registration.h"
#include "archspace/util/error.h"

namespace archspace {

namespace genmetrics {

using text::join_words;
using text::py_is_float;
using text::py_split;
using text::py_strip;

std::string drop_normalize(const std::string& span) {
  // _tokenize: re.split(" |-"), then per token lower, punctuation (unless a number), number, articles, spaces.
  std::vector<std::string> tokens;
  size_t start = 0;
  for (size_t i = 0; i <= span.size(); ++i) {
    if (i == span.size() || span[i] == ' ' || span[i] == '-') {
      tokens.push_back(span.substr(start, i - start));
      start = i + 1;
    }
  }
  std::vector<std::string> kept;
  for (const auto& token : tokens) {
    std::string t = text::py_lower(token);
    if (!py_is_float(t)) t = text::remove_punctuation(t);
    if (py_is_float(t)) t = text::py_float_repr(t);
    t = text::regex_sub("\\b(a|an|the)\\b", " ", t);
    t = join_words(py_split(t));
    if (!py_strip(t).empty()) kept.push_back(t);
  }
  return py_strip(join_words(kept));
}

namespace {

using Bag = std::set<std::string>;

double bag_f1(const Bag& predicted, const Bag& gold) {
  size_t common = 0;
  for (const auto& w : gold) common += predicted.count(w);
  const double precision = predicted.empty() ? 1.0 : static_cast<double>(common) / predicted.size();
  const double recall = gold.empty() ? 1.0 : static_cast<double>(common) / gold.size();
  return precision == 0.0 && recall == 0.0 ? 0.0 : 2 * precision * recall / (precision + recall);
}

bool numbers_match_if_present(const Bag& gold, const Bag& predicted) {
  bool gold_has = false;
  for (const auto& w : gold) {
    if (!py_is_float(w)) continue;
    gold_has = true;
    if (predicted.count(w)) return true;
  }
  return !gold_has;
}

// The largest total of scores[g][p] over one-to-one assignments of gold rows to predicted columns (exact: a
// dynamic programme over the subsets of the smaller side; scipy's linear_sum_assignment in lm-eval).
double best_assignment(const std::vector<std::vector<double>>& scores, size_t rows, size_t cols) {
  const bool transpose = cols > rows;  // iterate over the larger side, subsets of the smaller
  const size_t outer = transpose ? cols : rows, inner = transpose ? rows : cols;
  if (inner > 20) throw Error("DROP: too many answer spans to align (" + std::to_string(inner) + ")");
  std::vector<double> best(size_t{1} << inner, -1.0);
  best[0] = 0.0;
  for (size_t o = 0; o < outer; ++o) {
    std::vector<double> next = best;
    for (size_t mask = 0; mask < best.size(); ++mask) {
      if (best[mask] < 0) continue;
      for (size_t i = 0; i < inner; ++i) {
        if (mask & (size_t{1} << i)) continue;
        const double s = transpose ? scores[i][o] : scores[o][i];
        next[mask | (size_t{1} << i)] = std::max(next[mask | (size_t{1} << i)], best[mask] + s);
      }
    }
    best = std::move(next);
  }
  return *std::max_element(best.begin(), best.end());
}

std::pair<double, double> drop_metrics(const std::vector<std::string>& predicted,
                                       const std::vector<std::string>& gold) {
  std::vector<std::string> p_spans, g_spans;
  std::vector<Bag> p_bags, g_bags;
  for (const auto& s : predicted) {
    p_spans.push_back(drop_normalize(s));
    const auto words = py_split(p_spans.back());
    p_bags.emplace_back(words.begin(), words.end());
  }
  for (const auto& s : gold) {
    g_spans.push_back(drop_normalize(s));
    const auto words = py_split(g_spans.back());
    g_bags.emplace_back(words.begin(), words.end());
  }
  const std::set<std::string> p_set(p_spans.begin(), p_spans.end()), g_set(g_spans.begin(), g_spans.end());
  const double em = p_set == g_set && p_spans.size() == g_spans.size() ? 1.0 : 0.0;
  std::vector<std::vector<double>> scores(g_bags.size(), std::vector<double>(p_bags.size(), 0.0));
  for (size_t g = 0; g < g_bags.size(); ++g) {
    for (size_t p = 0; p < p_bags.size(); ++p) {
      if (numbers_match_if_present(g_bags[g], p_bags[p])) scores[g][p] = bag_f1(p_bags[p], g_bags[g]);
    }
  }
  const double total = best_assignment(scores, g_bags.size(), p_bags.size());
  const double mean = total / static_cast<double>(std::max(g_bags.size(), p_bags.size()));
  return {em, std::nearbyint(mean * 100.0) / 100.0};  // numpy's round(x, 2): rint(x * 100) / 100
}

}  // namespace

std::pair<double, double> drop_em_f1(const std::string& prediction,
                                     const std::vector<std::vector<std::string>>& gold_answers) {
  double em = 0, f1 = 0;
  for (const auto& gold : gold_answers) {
    if (gold.empty()) throw Error("DROP: a gold answer with no spans");
    const auto [e, f] = drop_metrics({prediction}, gold);
    if (!py_strip(gold[0]).empty()) {
      em = std::max(em, e);
      f1 = std::max(f1, f);
    }
  }
  return {em, f1};
}

}  // namespace genmetrics

namespace task_families {
namespace {

class Drop final : public GenerationTaskFamily {
 public:
  std::vector<GenerationTaskSpec> tasks() const override { return {{"drop", "", {"f1", "exact_match"}, "f1"}}; }
  void check_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) const override {
    if (!gold.is_array() || gold.empty() ||
        !std::all_of(gold.begin(), gold.end(), [&](const auto& x) { return all_strings(x); }))
      throw Error(
          "field \"gold\" must be a non-empty list of gold answers, each a non-empty list of span strings "
          "(task " +
          spec.task + ")");
  }
  // doc.answers: the list of gold span lists (the line's continuation is tuple text, not the gold).
  nlohmann::json gold_from_request(const GenerationTaskSpec& spec, const nlohmann::json& line) const override {
    const bool has =
        line.is_object() && line.contains("doc") && line["doc"].is_object() && line["doc"].contains("answers");
    return checked_gold_field(spec, has ? &line["doc"]["answers"] : nullptr, "doc.answers");
  }
  void score(const std::vector<const GenerationInstance*>& batch, const ExternalScorers&,
             const std::vector<InstanceMetrics*>& out) const override {
    score_each(batch, out, [](const GenerationInstance& x, InstanceMetrics& m) {
      const auto [em, f1] = genmetrics::drop_em_f1(x.generation, x.gold.get<std::vector<std::vector<std::string>>>());
      set_metric(m, "f1", f1);
      set_metric(m, "exact_match", em);
    });
  }
  std::optional<FewShotMarkers> few_shot_markers(const std::string&) const override {
    return FewShotMarkers{"Passage:", "\nAnswer:"};
  }
  // drop::llama3 (olmes oe_eval/configs/tasks.py:491) sets neither use_chat_format nor fewshot_as_multiturn; run
  // for a chat model (run_eval.py:327-329: chat_model makes use_chat_format the default) DROP's chat_overrides
  // (olmes oe_eval/tasks/oe_eval_tasks/drop.py:54-58) change only the stop sequences, so the shots and the
  // question are one user turn (base_task.py:548-558), no assistant prefix.
  std::optional<ChatSettings> chat_settings(const std::string&) const override { return ChatSettings{false, ""}; }
};

}  // namespace

ARCHSPACE_GENERATION_TASK_FAMILY(drop, Drop, 30)

}  // namespace task_families
}  // namespace archspace
