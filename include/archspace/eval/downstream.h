// Downstream evaluation on OLMES multiple-choice tasks (eval/task_files.h): every request's continuation
// log-likelihood, scored in batches (infer/score.h), then per document the choice each normalisation
// prefers, against the gold label.
//
// Tokenization is lm-evaluation-harness's (HFLM._encode_pair), so that the per-request log-likelihoods
// equal lm-eval's on the same model: trailing whitespace of the context moves to the front of the
// continuation; whole = encode(context + continuation), context_enc = encode(context), continuation_enc =
// whole[len(context_enc):] (the continuation's tokens as they come out of the joint text); an empty context
// becomes the one prefix token (bos_token_id, else eos_token_id; when the continuation's first token is that
// token already, it serves as the context instead); then context_enc + continuation_enc is
// left-truncated to max_length + 1 tokens (the last one is only scored, never run), keeping the continuation.
//
// Metrics (OLMES names; per document argmax over choices, the first maximum on ties):
//   acc_raw        sum of the continuation's token log-probabilities
//   acc_per_token  that sum / its number of tokens
//   acc_per_char   that sum / its number of characters (Unicode code points of the continuation as the
//                  file gives it, leading space included, as OLMES counts; OLMo's in-loop len_norm drops it)
//   acc_uncond     that sum minus the same continuation's after the unconditional context ("Answer:"),
//                  where the task has unconditional requests (PMI, OLMo's pmi_dc)
// A task whose family reads its own document labels is scored by the family instead (eval/tasks/truthfulqa.h,
// OLMES' MC1MC2Accuracy):
//   mc1            the label of the choice with the highest sum among the MC1 choices
//   mc2            the normalised probability mass of the true MC2 choices, sum exp(ll) true / sum exp(ll)
// Each with lm-eval's standard error of a mean: sqrt(sample variance / n), the sample variance with n - 1.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archspace/eval/task_files.h"
#include "archspace/infer/score.h"
#include "archspace/model/causal_lm.h"
#include "archspace/tokenizer/tokenizer.h"

namespace archspace {

// lm-eval's (context_enc, continuation_enc) of one request; throws when the continuation has no tokens.
std::pair<std::vector<uint32_t>, std::vector<uint32_t>> encode_request(const Tokenizer& tokenizer,
                                                                       const std::string& context,
                                                                       const std::string& continuation,
                                                                       uint32_t prefix_token);

// A task with its requests tokenized, ready to score any number of times (in-loop evaluation).
struct PreparedTask {
  TaskFiles files;
  std::vector<ScoreRequest> requests;  // one per files.requests entry, in the same order
};

// max_length: the longest sequence the model runs (0: the model's max_position_embeddings).
PreparedTask prepare_task(TaskFiles files, const Tokenizer& tokenizer, const ModelConfig& config,
                          int64_t max_length = 0);

struct RequestScore {
  double loglikelihood = 0;  // sum over the continuation's tokens
  bool is_greedy = false;    // every continuation token is the argmax there
  int64_t tokens = 0;        // continuation tokens
};

struct MetricValue {
  std::string name;  // acc_raw, acc_per_token, acc_per_char, acc_uncond; mc1, mc2; generation metrics
  double value = 0, stderr_ = 0;
  bool primary = false;
  std::string aggregate;  // a group's row (eval/task_groups.h): "macro" or "micro"; empty for a task
  // The value a uniform random guess expects: for accuracy, the mean over documents of 1 / the document's
  // number of choices; for TruthfulQA's mc2, the mean share of true answers among the mc2 choices; a group's
  // is the same aggregate (macro or micro) of its members'. NaN where there is none (generation metrics).
  double chance = std::numeric_limits<double>::quiet_NaN();
};

struct TaskResult {
  std::string task, format;          // format: rc, mc, or gen (generation tasks, eval/generation_metrics.h)
  int64_t shots = 0, documents = 0;  // shots < 0: not known (a rescored file without them): null, "-"
  int64_t members = 0;               // > 0: a group's row over that many member tasks (eval/task_groups.h)
  std::string primary_metric;
  std::vector<MetricValue> metrics;
  std::vector<RequestScore> requests;  // per files.requests entry
};

// The mean of per-document values with lm-eval's standard error sqrt(sample variance / n) (NaN for n = 1).
// (Inline: eval/generation_metrics uses it without the scoring code, e.g. in its fuzz target.)
inline MetricValue mean_with_stderr(const std::string& name, const std::vector<double>& xs) {
  MetricValue m;
  m.name = name;
  const auto n = static_cast<double>(xs.size());
  for (double x : xs) m.value += x;
  m.value /= n;
  double ss = 0;
  for (double x : xs) ss += (x - m.value) * (x - m.value);
  m.stderr_ = xs.size() > 1 ? std::sqrt(ss / (n - 1) / n) : std::numeric_limits<double>::quiet_NaN();
  return m;
}

// The metrics of one task from its requests' scores (in files.requests order).
TaskResult task_metrics(const TaskFiles& files, const std::vector<RequestScore>& scores);

// Scores every request of every task in one batched pass (sequences of all tasks share batches);
// progress(done, total) counts requests.
std::vector<TaskResult> evaluate_tasks(const CausalLM& model, const std::vector<PreparedTask>& tasks,
                                       const ScoreOptions& options = {},
                                       const std::function<void(int64_t, int64_t)>& progress = nullptr);

// The results as JSON rows {task, format, shots, n, metric, value, stderr, primary}, one per metric (stderr null
// when not finite); a group's rows add {aggregate, members}.
nlohmann::json results_rows(const std::vector<TaskResult>& results);

// A fixed-width table: one line per task and format, the primary metric first, then the others.
std::string results_table(const std::vector<TaskResult>& results);

// One JSON object per request {task, format, doc_id, idx, native_id, context, continuation, loglikelihood,
// is_greedy, n_continuation_tokens} (context and continuation as the file gives them).
std::vector<nlohmann::json> request_rows(const TaskFiles& files, const TaskResult& result);

}  // namespace archspace
