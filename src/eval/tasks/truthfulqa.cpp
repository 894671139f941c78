// truthfulqa (every task whose name starts so): its few-shot prompts are "Q: ...\nA: ..." blocks, rendered as
// truthfulqa::tulu does (olmes oe_eval/configs/tasks.py:5578: use_chat_format without fewshot_as_multiturn, so its
// six shots and the question are one user turn). Its documents carry their own labels (eval/tasks/truthfulqa.h:
// MultiTrueLabels, read from each document's doc), and score mc1 and mc2.
#include "archspace/eval/tasks/truthfulqa.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "archspace/eval/task_family_registration.h"
#include "archspace/util/error.h"

namespace archspace {

void MultiTrueLabels::fit_choices(int64_t k) {
  if (mc2_indices.empty()) {  // lm-eval's form: one request per MC2 choice
    for (int64_t i = 0; i < k; ++i) mc2_indices.push_back(i);
  }
  const auto within = [k](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [k](int64_t i) { return i < k; });
  };
  if (static_cast<int64_t>(labels.size()) != k || !within(mc1_indices) || !within(mc2_indices))
    throw Error("its " + std::to_string(labels.size()) +
                " labels (doc.labels or doc.mc2_targets.labels) and its indices must cover its " + std::to_string(k) +
                " choices");
}

nlohmann::json MultiTrueLabels::to_json() const {
  return {{"labels", labels}, {"mc1_indices", mc1_indices}, {"mc2_indices", mc2_indices}};
}

// OLMES' MC1MC2Accuracy.process_one_doc (olmes 99cf8bb7, oe_eval/metrics/metric.py:352-378) on one document's
// choice log-likelihoods, its requests in idx order (OLMES' doc group keeps their order, metric.py:95-102): mc1, the
// label of the first highest-scoring request whose idx is in mc1_indices; mc2, sum exp(ll) over the requests whose
// idx is in mc2_indices and whose label is true, over all of those (membership: an index listed twice counts once;
// the sums in request order, as OLMES adds them). Where every exp(ll) underflows to 0 OLMES divides 0 by 0 and
// raises; the engine then takes the exps relative to the largest log-likelihood, the same quotient.
std::pair<double, double> truthfulqa_mc1_mc2(const MultiTrueLabels& l, const std::map<int64_t, double>& ll) {
  const std::set<int64_t> in_mc1(l.mc1_indices.begin(), l.mc1_indices.end());
  const std::set<int64_t> in_mc2(l.mc2_indices.begin(), l.mc2_indices.end());
  for (int64_t i : l.mc1_indices) (void)ll.at(i);  // every ranked and weighed choice has its request
  for (int64_t i : l.mc2_indices) (void)ll.at(i);
  double mc1 = 0, best = -std::numeric_limits<double>::infinity();
  double top = -std::numeric_limits<double>::infinity();
  for (const auto& [idx, x] : ll) {
    if (in_mc1.count(idx) && x > best) {
      best = x;
      mc1 = static_cast<double>(l.labels[static_cast<size_t>(idx)]);
    }
    if (in_mc2.count(idx)) top = std::max(top, x);
  }
  const auto mass = [&](double shift) {
    double p_true = 0, p_false = 0;
    for (const auto& [idx, x] : ll) {
      if (!in_mc2.count(idx)) continue;
      (l.labels[static_cast<size_t>(idx)] ? p_true : p_false) += std::exp(x - shift);
    }
    return std::make_pair(p_true, p_false);
  };
  auto [p_true, p_false] = mass(0.0);
  if (p_true + p_false == 0.0) std::tie(p_true, p_false) = mass(top);
  return {mc1, p_true / (p_true + p_false)};
}

}  // namespace archspace

namespace archspace::task_families {
namespace {

// A document's labels from one of its request lines' doc: OLMES' labels, mc1_indices, mc2_indices, or lm-eval's
// mc2_targets.labels; null for a doc with neither.
std::shared_ptr<MultiTrueLabels> read_multi_true(const nlohmann::json& doc, const std::string& where) {
  const bool olmes = doc.contains("labels") && doc.contains("mc2_indices");
  const bool lm_eval = doc.contains("mc2_targets") && doc["mc2_targets"].is_object();
  if (!olmes && !lm_eval) return nullptr;
  const auto ints = [&](const nlohmann::json& v, const std::string& field, bool binary) {
    if (!v.is_array()) throw Error(where + ": field \"doc." + field + "\" must be a list of integers");
    std::vector<int64_t> out;
    for (const auto& x : v) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || (binary && x.get<int64_t>() > 1))
        throw Error(where + ": field \"doc." + field + "\" must be a list of " +
                    (binary ? "0/1 labels" : "choice indices"));
      out.push_back(x.get<int64_t>());
    }
    return out;
  };
  auto l = std::make_shared<MultiTrueLabels>();
  if (olmes) {
    l->labels = ints(doc["labels"], "labels", true);
    if (doc.contains("mc1_indices")) l->mc1_indices = ints(doc["mc1_indices"], "mc1_indices", false);
    l->mc2_indices = ints(doc["mc2_indices"], "mc2_indices", false);
    if (l->mc2_indices.empty()) throw Error(where + ": field \"doc.mc2_indices\" is empty");
  } else {
    l->labels = ints(json_field(doc["mc2_targets"], "labels", where + " doc.mc2_targets"), "mc2_targets.labels", true);
  }
  return l;
}

// The document's labels as requests-out rows carry them (`archspace compare`), checked against its rows' choices.
MultiTrueLabels labels_from_row(const nlohmann::json& row, const std::map<int64_t, double>& ll) {
  MultiTrueLabels labels(row.at("labels").get<std::vector<int64_t>>(),
                         row.at("mc1_indices").get<std::vector<int64_t>>(),
                         row.at("mc2_indices").get<std::vector<int64_t>>());
  for (const auto* list : {&labels.mc1_indices, &labels.mc2_indices}) {
    for (int64_t i : *list) {
      if (i < 0 || i >= static_cast<int64_t>(labels.labels.size()) || !ll.count(i))
        throw Error("choice " + std::to_string(i) + " has no label or no row");
    }
  }
  return labels;
}

TaskResult multi_true_metrics(const TaskFiles& files, TaskResult result) {
  std::map<int64_t, std::map<int64_t, double>> ll;  // doc -> idx -> log-likelihood
  for (size_t i = 0; i < files.requests.size(); ++i)
    ll[files.requests[i].doc_id][files.requests[i].idx] = result.requests[i].loglikelihood;
  std::vector<double> mc1, mc2;
  double chance1 = 0, chance2 = 0;  // uniform guessing: 1 / mc1 choices (one is true), true / mc2 choices
  bool has_mc1 = true;
  for (const auto& [doc_id, own] : files.document_labels) {
    const auto& labels = dynamic_cast<const MultiTrueLabels&>(*own);
    const auto [a, b] = truthfulqa_mc1_mc2(labels, ll.at(doc_id));
    mc1.push_back(a);
    mc2.push_back(b);
    has_mc1 &= !labels.mc1_indices.empty();
    // The distinct choices, as the metrics count them.
    const std::set<int64_t> ranked(labels.mc1_indices.begin(), labels.mc1_indices.end());
    const std::set<int64_t> weighed(labels.mc2_indices.begin(), labels.mc2_indices.end());
    if (!ranked.empty()) chance1 += 1.0 / static_cast<double>(ranked.size());
    double truths = 0;
    for (int64_t i : weighed) truths += labels.labels[static_cast<size_t>(i)] ? 1 : 0;
    chance2 += truths / static_cast<double>(weighed.size());
  }
  result.documents = static_cast<int64_t>(files.document_labels.size());
  const auto docs = static_cast<double>(result.documents);
  if (has_mc1) {
    result.metrics.push_back(mean_with_stderr("mc1", mc1));
    result.metrics.back().chance = chance1 / docs;
  }
  result.metrics.push_back(mean_with_stderr("mc2", mc2));
  result.metrics.back().chance = chance2 / docs;
  bool found = false;
  for (auto& m : result.metrics) {
    m.primary = m.name == files.primary_metric;
    found |= m.primary;
  }
  if (!found)
    throw Error(files.dir + "/config.json: primary_metric \"" + files.primary_metric +
                "\" is not one this task's requests give (" + (has_mc1 ? "mc1, " : "") + "mc2)");
  return result;
}

class TruthfulQa final : public MultipleChoiceTaskFamily {
 public:
  bool has_task(const std::string& task) const override { return task.starts_with("truthfulqa"); }
  FewShotMarkers few_shot_markers(const std::string&) const override { return {"Q:", "\nA:"}; }
  ChatSettings chat_settings(const std::string&) const override { return {false, ""}; }
  // Chosen by the documents' labels, not the task's name (task_metrics asks every family).
  std::optional<TaskResult> metrics(const TaskFiles& files, const TaskResult& result) const override {
    if (files.document_labels.empty() ||
        !dynamic_cast<const MultiTrueLabels*>(files.document_labels.begin()->second.get()))
      return std::nullopt;
    return multi_true_metrics(files, result);
  }
  std::shared_ptr<DocumentLabels> read_document_labels(const nlohmann::json& doc,
                                                       const std::string& where) const override {
    return read_multi_true(doc, where);
  }
  std::string document_labels_field() const override { return "multi_true"; }
  std::vector<std::string> document_metrics() const override { return {"mc1", "mc2"}; }
  double document_metric(const std::string& metric, const nlohmann::json& labels,
                         const std::map<int64_t, double>& ll) const override {
    const auto [mc1, mc2] = truthfulqa_mc1_mc2(labels_from_row(labels, ll), ll);
    return metric == "mc1" ? mc1 : mc2;
  }
};

}  // namespace

ARCHSPACE_MULTIPLE_CHOICE_TASK_FAMILY(truthfulqa, TruthfulQa, 10)

}  // namespace archspace::task_families
