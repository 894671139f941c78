// The defaults of eval/generation_task_family.h and the helpers its families share.
#include "archspace/eval/generation_task_family.h"

#include <algorithm>

#include "archspace/text/python_re.h"
#include "archspace/text/python_str.h"
#include "archspace/util/error.h"
#include "archspace/util/json_file.h"

namespace archspace {

namespace {

// The request's generation settings: request.generation_kwargs, else the config's (both as OLMES writes them).
void read_generation_kwargs(const nlohmann::json& kwargs, GenerationPrompt& r, const std::string& where) {
  r.max_gen_toks = json_int_field(kwargs, "max_gen_toks", where);
  if (r.max_gen_toks < 1) throw Error(where + ": max_gen_toks must be at least 1");
  if (kwargs.contains("temperature")) {
    if (!kwargs["temperature"].is_number()) throw Error(where + ": field \"temperature\" must be a number");
    r.temperature = kwargs["temperature"].get<double>();
    if (!(r.temperature >= 0 && r.temperature <= 2)) throw Error(where + ": temperature must be in [0, 2]");
  }
  if (kwargs.contains("do_sample")) {
    if (!kwargs["do_sample"].is_boolean()) throw Error(where + ": field \"do_sample\" must be true or false");
    r.do_sample = kwargs["do_sample"].get<bool>();
  }
}

}  // namespace

GenerationPrompt GenerationTaskFamily::read_prompt(const nlohmann::json& line, const RequestFile& file,
                                                   const std::string& where) const {
  GenerationPrompt r;
  const nlohmann::json& request = json_field(line, "request", where);
  const nlohmann::json& context = json_field(request, "context", where + " request");
  if (file.chat) {
    r.chat = chat_prompt(context, file.task, file.shots, where);
    r.context = chat_prompt_text(*r.chat, where);
  } else if (context.is_object()) {
    throw Error(where + ": request.context is a chat-format conversation (OLMES' use_chat_format): add --chat");
  } else {
    r.context = json_string_field(request, "context", where + " request");
  }
  const nlohmann::json& stops = json_field(request, "stop_sequences", where + " request");
  if (!stops.is_array()) throw Error(where + ": request.stop_sequences must be a list of strings");
  for (const auto& s : stops) {
    if (!s.is_string()) throw Error(where + ": request.stop_sequences must be a list of strings");
    if (s.get<std::string>().empty())
      throw Error(where + ": request.stop_sequences has an empty string (it would stop before any text)");
    r.stop_sequences.push_back(s.get<std::string>());
  }
  read_generation_kwargs(request.contains("generation_kwargs")
                             ? request["generation_kwargs"]
                             : json_field(file.task_config, "generation_kwargs", file.config_path + " task_config"),
                         r, where + " request.generation_kwargs");
  return r;
}

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
