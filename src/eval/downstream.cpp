#include "archspace/eval/downstream.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "archspace/eval/multiple_choice_task_family.h"
#include "archspace/text/utf8.h"
#include "archspace/util/error.h"
#include "archspace/util/strings.h"

namespace archspace {

namespace {

// Python's str.isspace for the ASCII range (what rstrip() removes in OLMES contexts).
bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); }

// Index of the first maximum (numpy.argmax).
size_t argmax(const std::vector<double>& v) {
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i) {
    if (v[i] > v[best]) best = i;
  }
  return best;
}

}  // namespace

std::pair<std::vector<uint32_t>, std::vector<uint32_t>> encode_request(const Tokenizer& tokenizer,
                                                                       const std::string& context,
                                                                       const std::string& continuation,
                                                                       uint32_t prefix_token) {
  std::vector<uint32_t> context_enc, continuation_enc;
  if (context.empty()) {
    // lm-eval 0.4.13: the prefix token is the context; a continuation that starts with it gives it up.
    context_enc = {prefix_token};
    continuation_enc = tokenizer.encode(continuation);
    if (!continuation_enc.empty() && continuation_enc[0] == prefix_token)
      continuation_enc.erase(continuation_enc.begin());
  } else {
    size_t end = context.size();
    while (end > 0 && is_space(context[end - 1])) --end;
    const std::string ctx = context.substr(0, end), cont = context.substr(end) + continuation;
    const std::vector<uint32_t> whole = tokenizer.encode(ctx + cont);
    context_enc = tokenizer.encode(ctx);
    if (context_enc.size() <= whole.size())
      continuation_enc.assign(whole.begin() + static_cast<std::ptrdiff_t>(context_enc.size()), whole.end());
  }
  if (continuation_enc.empty()) throw Error("the continuation \"" + continuation + "\" has no tokens of its own");
  return {context_enc, continuation_enc};
}

PreparedTask prepare_task(TaskFiles files, const Tokenizer& tokenizer, const ModelConfig& config, int64_t max_length) {
  if (max_length <= 0) max_length = config.max_position_embeddings;
  const auto prefix = static_cast<uint32_t>(config.bos_token_id.value_or(config.eos_token_id.value_or(0)));
  require_plain_contexts(files);
  PreparedTask p;
  p.requests.reserve(files.requests.size());
  for (const TaskRequest& r : files.requests) {
    std::vector<uint32_t> ids, cont;
    try {
      std::tie(ids, cont) = encode_request(tokenizer, r.context, r.continuation, prefix);
    } catch (const Error& e) {
      throw Error(files.dir + ": document " + std::to_string(r.doc_id) + " choice " + std::to_string(r.idx) + ": " +
                  e.what());
    }
    if (static_cast<int64_t>(cont.size()) > max_length) {
      throw Error(files.dir + ": document " + std::to_string(r.doc_id) + " choice " + std::to_string(r.idx) +
                  ": its continuation alone has " + std::to_string(cont.size()) + " tokens, more than the " +
                  std::to_string(max_length) + " the model runs");
    }
    ids.insert(ids.end(), cont.begin(), cont.end());
    // Left truncation keeps the last max_length + 1 tokens (the last is a target only).
    const auto keep = static_cast<size_t>(max_length + 1);
    if (ids.size() > keep) ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(keep));
    ScoreRequest q;
    q.first_scored = static_cast<int64_t>(ids.size() - cont.size());
    q.ids = std::move(ids);
    p.requests.push_back(std::move(q));
  }
  p.files = std::move(files);
  return p;
}

TaskResult task_metrics(const TaskFiles& files, const std::vector<RequestScore>& scores) {
  if (scores.size() != files.requests.size()) throw Error("task_metrics: one score per request expected");
  TaskResult result;
  result.task = files.task;
  result.format = files.format;
  result.shots = files.shots;
  result.primary_metric = files.primary_metric;
  result.requests = scores;
  // A family that scores its documents itself (TruthfulQA's labels: src/eval/tasks/truthfulqa.cpp).
  for (const auto* family : multiple_choice_task_families()) {
    if (auto own = family->metrics(files, result)) return *std::move(own);
  }

  // doc_id -> choice -> request index, for conditional and unconditional requests.
  std::map<int64_t, std::map<int64_t, size_t>> cond, uncond;
  for (size_t i = 0; i < files.requests.size(); ++i) {
    const TaskRequest& r = files.requests[i];
    if (files.uncond_offset > 0 && r.doc_id >= files.uncond_offset) {
      uncond[r.doc_id - files.uncond_offset][r.idx] = i;
    } else {
      cond[r.doc_id][r.idx] = i;
    }
  }
  std::vector<double> raw, per_token, per_char, pmi;
  double chance = 0;  // sum over documents of 1 / choices: a uniform guess's expected accuracy
  for (const auto& [doc_id, choices] : cond) {
    chance += 1.0 / static_cast<double>(choices.size());
    std::vector<double> s_raw, s_token, s_char, s_pmi;
    std::vector<int64_t> idxs;  // the requests' idx, in order
    int64_t label = 0;
    for (const auto& [idx, i] : choices) {
      const TaskRequest& r = files.requests[i];
      label = r.label;
      idxs.push_back(idx);
      const double ll = scores[i].loglikelihood;
      s_raw.push_back(ll);
      s_token.push_back(ll / static_cast<double>(scores[i].tokens));
      s_char.push_back(ll / static_cast<double>(std::max<int64_t>(1, text::utf8_character_count(r.continuation))));
      if (!uncond.empty()) s_pmi.push_back(ll - scores[uncond.at(doc_id).at(idx)].loglikelihood);
    }
    // OLMES' MCAccuracy (oe_eval/metrics/metric.py:265-267): the idx of the first request with the highest score
    // against the label.
    const auto correct = [&](const std::vector<double>& v) { return idxs[argmax(v)] == label ? 1.0 : 0.0; };
    raw.push_back(correct(s_raw));
    per_token.push_back(correct(s_token));
    per_char.push_back(correct(s_char));
    if (!uncond.empty()) pmi.push_back(correct(s_pmi));
  }
  result.documents = static_cast<int64_t>(cond.size());
  result.metrics = {mean_with_stderr("acc_raw", raw), mean_with_stderr("acc_per_token", per_token),
                    mean_with_stderr("acc_per_char", per_char)};
  if (!pmi.empty()) result.metrics.push_back(mean_with_stderr("acc_uncond", pmi));
  for (auto& m : result.metrics) m.chance = chance / static_cast<double>(cond.size());
  bool found = false;
  for (auto& m : result.metrics) {
    m.primary = m.name == files.primary_metric;
    found |= m.primary;
  }
  if (!found) {
    throw Error(files.dir + "/config.json: primary_metric \"" + files.primary_metric +
                "\" is not one this task's requests give (acc_raw, acc_per_token, acc_per_char" +
                (pmi.empty() ? "" : ", acc_uncond") + ")");
  }
  return result;
}

std::vector<TaskResult> evaluate_tasks(const CausalLM& model, const std::vector<PreparedTask>& tasks,
                                       const ScoreOptions& options,
                                       const std::function<void(int64_t, int64_t)>& progress) {
  std::vector<ScoreRequest> all;
  for (const auto& t : tasks) all.insert(all.end(), t.requests.begin(), t.requests.end());
  const std::vector<SequenceScore> scores = score_sequences(model, all, options, progress);
  std::vector<TaskResult> results;
  size_t next = 0;
  for (const auto& t : tasks) {
    std::vector<RequestScore> task_scores;
    for (size_t i = 0; i < t.requests.size(); ++i, ++next) {
      const SequenceScore& s = scores[next];
      task_scores.push_back({s.sum_logprob(), s.all_greedy(), static_cast<int64_t>(s.tokens.size())});
    }
    results.push_back(task_metrics(t.files, task_scores));
  }
  return results;
}

nlohmann::json results_rows(const std::vector<TaskResult>& results) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : results) {
    for (const auto& m : r.metrics) {
      nlohmann::json row = {{"task", r.task},
                            {"format", r.format},
                            {"shots", r.shots >= 0 ? nlohmann::json(r.shots) : nlohmann::json()},
                            {"n", r.documents},
                            {"metric", m.name},
                            {"value", m.value},
                            {"stderr", std::isfinite(m.stderr_) ? nlohmann::json(m.stderr_) : nlohmann::json()},
                            {"primary", m.primary},
                            {"chance", std::isfinite(m.chance) ? nlohmann::json(m.chance) : nlohmann::json()}};
      if (r.members > 0) {
        row["aggregate"] = m.aggregate;
        row["members"] = r.members;
      }
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

std::string results_table(const std::vector<TaskResult>& results) {
  // A group's row is marked by its primary aggregate, "(macro)" or "(micro)"; the task column fits the longest name
  // (minerva_math_counting_and_probability).
  const auto label = [](const TaskResult& r) {
    if (r.members == 0) return r.task;
    for (const auto& m : r.metrics) {
      if (m.primary && !m.aggregate.empty()) return r.task + " (" + m.aggregate + ")";  // bbh: micro
    }
    return r.task + " (macro)";
  };
  int width = 18;
  for (const auto& r : results) width = std::max(width, static_cast<int>(label(r).size()));
  // chance: the primary metric's value under uniform guessing (MetricValue::chance), "-" where there is none.
  std::string out = format_string("%-*s %-6s %5s %6s  %-14s %-17s %-6s %s\n", width, "task", "format", "shots", "n",
                                  "primary", "value +- stderr", "chance", "others");
  for (const auto& r : results) {
    std::string primary, others, chance = "-";
    for (const auto& m : r.metrics) {
      if (m.primary) {
        primary = format_string("%.4f +- %.4f", m.value, m.stderr_);
        if (std::isfinite(m.chance)) chance = format_string("%.4f", m.chance);
      } else {
        others += (others.empty() ? "" : ", ") +
                  format_string("%s%s %.4f", m.name.c_str(), m.aggregate == "micro" ? " micro" : "", m.value);
      }
    }
    const std::string task = label(r);
    const std::string shots = r.shots >= 0 ? std::to_string(r.shots) : "-";
    out += format_string("%-*s %-6s %5s %6lld  %-14s %-17s %-6s %s\n", width, task.c_str(), r.format.c_str(),
                         shots.c_str(), static_cast<long long>(r.documents), r.primary_metric.c_str(), primary.c_str(),
                         chance.c_str(), others.c_str());
  }
  return out;
}

std::vector<nlohmann::json> request_rows(const TaskFiles& files, const TaskResult& result) {
  std::vector<nlohmann::json> rows;
  const std::string labels_field = multiple_choice_task_family(files.task).document_labels_field();
  for (size_t i = 0; i < files.requests.size(); ++i) {
    const TaskRequest& r = files.requests[i];
    const RequestScore& s = result.requests.at(i);
    rows.push_back({{"task", files.task},
                    {"format", files.format},
                    {"doc_id", r.doc_id},
                    {"idx", r.idx},
                    {"native_id", r.native_id},
                    {"context", r.context},
                    {"continuation", r.continuation},
                    {"loglikelihood", s.loglikelihood},
                    {"is_greedy", s.is_greedy},
                    {"n_continuation_tokens", s.tokens},
                    // What `archspace compare` needs to score each document from the rows alone.
                    {"label", r.label},
                    {"primary_metric", files.primary_metric},
                    {"unconditional", files.uncond_offset > 0 && r.doc_id >= files.uncond_offset}});
    // acc_uncond pairs a choice with its unconditional request at doc_id + uncond_offset; a document with its own
    // labels is scored by its family from them.
    if (files.uncond_offset > 0) rows.back()["uncond_offset"] = files.uncond_offset;
    if (const auto it = files.document_labels.find(r.doc_id); it != files.document_labels.end())
      rows.back()[labels_field] = it->second->to_json();
  }
  return rows;
}

}  // namespace archspace
