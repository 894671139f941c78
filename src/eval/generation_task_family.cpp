// The defaults of eval/generation_task_family.h and the helpers its families share.
#include "archspace/eval/generation_task_family.h"

#include <algorithm>

#include "archspace/text/python_re.h"
#include "archspace/text/python_str.h"
#include "archspace/util/error.h"

namespace archspace {

nlohmann::json GenerationTaskFamily::gold_from_request(const GenerationTaskSpec& spec,
                                                       const nlohmann::json& request_line) const {
  const bool has = request_line.is_object() && request_line.contains("label");
  return checked_gold_field(spec, has ? &request_line["label"] : nullptr, "label");
}

MetricValue GenerationTaskFamily::aggregate(const std::string& metric, const std::vector<const GenerationInstance*>&,
                                            const std::vector<double>& values) const {
  return mean_with_stderr(metric, values);
}

std::optional<FewShotMarkers> GenerationTaskFamily::few_shot_markers(const std::string&) const { return std::nullopt; }

std::optional<ChatSettings> GenerationTaskFamily::chat_settings(const std::string&) const { return std::nullopt; }

namespace {

std::pair<std::string, double>* find_metric(InstanceMetrics& metrics, const std::string& name) {
  for (auto& entry : metrics.values) {
    if (entry.first == name) return &entry;
  }
  return nullptr;
}

}  // namespace

void set_metric(InstanceMetrics& metrics, const std::string& name, double value) {
  auto* entry = find_metric(metrics, name);
  if (!entry) throw Error("set_metric: the task has no metric \"" + name + "\"");
  entry->second = value;
}

double metric_value(const InstanceMetrics& metrics, const std::string& name) {
  for (const auto& [n, v] : metrics.values) {
    if (n == name) return v;
  }
  throw Error("metric_value: the instance has no metric \"" + name + "\"");
}

void score_each(const std::vector<const GenerationInstance*>& batch, const std::vector<InstanceMetrics*>& out,
                const std::function<void(const GenerationInstance&, InstanceMetrics&)>& score_one) {
  for (size_t i = 0; i < batch.size(); ++i) {
    InstanceMetrics& m = *out[i];
    try {
      score_one(*batch[i], m);
    } catch (const std::exception& e) {  // this response scores 0, named; the others are still scored
      for (auto& entry : m.values) entry.second = 0.0;
      m.scoring_errors.push_back(e.what());
    }
  }
}

bool all_strings(const nlohmann::json& j) {
  return j.is_array() && !j.empty() && std::all_of(j.begin(), j.end(), [](const auto& x) { return x.is_string(); });
}

void check_string_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) {
  if (!gold.is_string()) throw Error("field \"gold\" must be a string (task " + spec.task + ")");
}

void check_strings_gold(const GenerationTaskSpec& spec, const nlohmann::json& gold) {
  if (!gold.is_string() && !all_strings(gold))
    throw Error("field \"gold\" must be a string or a non-empty list of strings (task " + spec.task + ")");
}

std::vector<std::string> strings_gold(const nlohmann::json& gold) {
  if (gold.is_string()) return {gold.get<std::string>()};
  return gold.get<std::vector<std::string>>();
}

nlohmann::json checked_gold_field(const GenerationTaskSpec& spec, const nlohmann::json* gold,
                                  const std::string& field) {
  if (!gold) throw Error("missing field \"" + field + "\" (the gold of task " + spec.task + ")");
  try {
    spec.family->check_gold(spec, *gold);
  } catch (const Error& e) {
    throw Error("field \"" + field + "\": " + e.what());
  }
  return *gold;
}

namespace genmetrics {

namespace {

// A numpy str array drops its elements' trailing NUL characters (numpy stores fixed-width UCS-4 padded with NULs).
void drop_trailing_nuls(std::string& s) {
  while (!s.empty() && s.back() == '\0') s.pop_back();
}

}  // namespace

bool exact_match(std::string prediction, std::string reference, const std::vector<std::string>& regexes_to_ignore,
                 bool ignore_case, bool ignore_punctuation) {
  // exact_match_hf_evaluate (OLMES' copy: oe_eval/dependencies/hf_evaluate/exact_match.py:25-57; lm-eval's is the
  // same): each regex's re.sub result, or the inputs themselves when there are none, becomes a numpy str array,
  // which drops trailing NULs before the next step sees them; lower() and the punctuation table then work on the
  // array and the comparison is the arrays' (trailing NULs dropped again).
  if (regexes_to_ignore.empty()) {
    drop_trailing_nuls(prediction);
    drop_trailing_nuls(reference);
  }
  for (const auto& r : regexes_to_ignore) {
    prediction = text::regex_sub(r, "", prediction);
    reference = text::regex_sub(r, "", reference);
    drop_trailing_nuls(prediction);
    drop_trailing_nuls(reference);
  }
  if (ignore_case) {
    prediction = text::py_lower(prediction);
    reference = text::py_lower(reference);
  }
  if (ignore_punctuation) {
    prediction = text::remove_punctuation(prediction);
    reference = text::remove_punctuation(reference);
  }
  drop_trailing_nuls(prediction);
  drop_trailing_nuls(reference);
  return prediction == reference;
}

}  // namespace genmetrics

}  // namespace archspace
