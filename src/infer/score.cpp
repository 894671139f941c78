#include "archspace/infer/score.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "archspace/model/loss.h"
#include "archspace/util/error.h"

namespace archspace {

double SequenceScore::sum_logprob() const {
  double sum = 0;
  for (const auto& t : tokens) sum += t.logprob;
  return sum;
}

bool SequenceScore::all_greedy() const {
  return std::all_of(tokens.begin(), tokens.end(), [](const TokenLogprob& t) { return t.greedy; });
}

namespace {

// The tokens that go through the model: without next_token the last token is only a target, never an
// input (as lm-eval, which feeds (context + continuation)[:-1]), so a sequence of max_position_embeddings + 1
// tokens still fits.
int64_t forward_length(const ScoreRequest& q) { return static_cast<int64_t>(q.ids.size()) - (q.next_token ? 0 : 1); }

void validate(const CausalLM& model, const std::vector<ScoreRequest>& requests, const ScoreOptions& options) {
  const ModelConfig& c = model.config();
  if (options.top_logprobs < 0) throw Error("scoring: top_logprobs must be >= 0");
  if (options.max_batch_tokens < 1 || options.head_chunk < 1 || options.max_batch_sequences < 0) {
    throw Error("scoring: max_batch_tokens and head_chunk must be at least 1, max_batch_sequences at least 0");
  }
  for (size_t r = 0; r < requests.size(); ++r) {
    const ScoreRequest& q = requests[r];
    const auto n = static_cast<int64_t>(q.ids.size());
    const std::string which = "scoring request " + std::to_string(r) + ": ";
    if (n == 0) throw Error(which + "no tokens");
    if (q.first_scored < 1 || q.first_scored > n) {
      throw Error(which + "first scored token " + std::to_string(q.first_scored) + " is outside [1, " +
                  std::to_string(n) + "] (the first token has no context)");
    }
    if (forward_length(q) > c.max_position_embeddings) {
      throw Error(which + std::to_string(forward_length(q)) + " tokens to run exceed the model's context of " +
                  std::to_string(c.max_position_embeddings) + " (max_position_embeddings)");
    }
    for (uint32_t id : q.ids) {
      if (id >= static_cast<uint64_t>(c.vocab_size)) {
        throw Error(which + "token id " + std::to_string(id) + " is outside the vocabulary (size " +
                    std::to_string(c.vocab_size) + ")");
      }
    }
  }
}

// Scores one batch of requests (indices into `requests`), right-padded to the longest.
void score_batch(const CausalLM& model, const std::vector<ScoreRequest>& requests, const std::vector<size_t>& batch,
                 const ScoreOptions& options, std::vector<SequenceScore>& out) {
  const auto B = static_cast<int64_t>(batch.size());
  int64_t T = 1;
  for (size_t r : batch) T = std::max<int64_t>(T, forward_length(requests[r]));
  at::Tensor ids = at::zeros({B, T}, at::kLong);
  auto ids_a = ids.accessor<int64_t, 2>();
  // rows: flat hidden-state rows to put through the head; targets: the token each row must predict (-1:
  // the next-token row, which predicts nothing).
  std::vector<int64_t> rows, targets;
  for (int64_t b = 0; b < B; ++b) {
    const ScoreRequest& q = requests[batch[b]];
    const auto n = static_cast<int64_t>(q.ids.size());
    for (int64_t t = 0; t < forward_length(q); ++t) ids_a[b][t] = q.ids[t];
    for (int64_t t = q.first_scored; t < n; ++t) {
      rows.push_back(b * T + t - 1);
      targets.push_back(q.ids[t]);
    }
    if (q.next_token) {
      rows.push_back(b * T + n - 1);
      targets.push_back(-1);
    }
  }
  ForwardOptions fwd;
  fwd.final_hidden_only = true;
  const at::Tensor hidden = model.forward(ids.to(model.device()), fwd);
  const at::Tensor flat = hidden.reshape({B * T, hidden.size(-1)});

  // Results per row, then handed out to the sequences in row order.
  std::vector<TokenLogprob> scored(rows.size());
  std::vector<at::Tensor> next_rows(rows.size());
  const at::Tensor rows_t = at::tensor(rows, at::kLong).to(model.device());
  // The chosen rows through the head, a chunk at a time (model/loss.h); the visitor reads what else of each
  // chunk's distribution is asked for.
  auto visit = [&](int64_t start, const at::Tensor& logprobs) {
    const int64_t len = logprobs.size(0);
    const at::Tensor argmax = logprobs.argmax(-1).cpu();
    at::Tensor top_values, top_ids;
    if (options.top_logprobs > 0) {
      std::tie(top_values, top_ids) = logprobs.topk(std::min(options.top_logprobs, logprobs.size(-1)), -1);
      top_values = top_values.cpu();
      top_ids = top_ids.cpu();
    }
    const auto argmax_a = argmax.accessor<int64_t, 1>();
    for (int64_t i = 0; i < len; ++i) {
      const int64_t row = start + i;
      TokenLogprob& s = scored[row];
      if (targets[row] < 0) {
        next_rows[row] = logprobs[i].cpu().clone();
      } else {
        s.greedy = argmax_a[i] == targets[row];
      }
      if (options.top_logprobs > 0) {
        const at::Tensor values_i = top_values[i], ids_i = top_ids[i];  // accessors need lvalues
        const auto v = values_i.accessor<float, 1>();
        const auto k = ids_i.accessor<int64_t, 1>();
        for (int64_t j = 0; j < v.size(0); ++j) s.top.emplace_back(static_cast<uint32_t>(k[j]), v[j]);
      }
    }
  };
  const at::Tensor picked = label_logprobs(flat.index_select(0, rows_t), model.head_weight(),
                                           at::tensor(targets, at::kLong), options.head_chunk, visit)
                                .cpu();
  const auto picked_a = picked.accessor<float, 1>();
  for (size_t row = 0; row < rows.size(); ++row)
    if (targets[row] >= 0) scored[row].logprob = picked_a[row];
  size_t row = 0;
  for (int64_t b = 0; b < B; ++b) {
    const ScoreRequest& q = requests[batch[b]];
    SequenceScore& s = out[batch[b]];
    const auto n = static_cast<int64_t>(q.ids.size());
    for (int64_t t = q.first_scored; t < n; ++t) s.tokens.push_back(std::move(scored[row++]));
    if (q.next_token) s.next_logprobs = next_rows[row++];
  }
}

}  // namespace

std::vector<SequenceScore> score_sequences(const CausalLM& model, const std::vector<ScoreRequest>& requests,
                                           const ScoreOptions& options,
                                           const std::function<void(int64_t, int64_t)>& progress) {
  validate(model, requests, options);
  c10::InferenceMode guard;
  // Longest first, so that a batch's padding is small and the memory peak comes first.
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return requests[a].ids.size() > requests[b].ids.size(); });
  std::vector<SequenceScore> out(requests.size());
  const auto total = static_cast<int64_t>(requests.size());
  int64_t done = 0;
  for (size_t i = 0; i < order.size();) {
    // Sorted descending, so the first sequence sets the padded length of the batch.
    const int64_t longest = std::max<int64_t>(1, forward_length(requests[order[i]]));
    int64_t fit = std::max<int64_t>(1, options.max_batch_tokens / longest);
    if (options.max_batch_sequences > 0) fit = std::min(fit, options.max_batch_sequences);
    const size_t end = std::min(order.size(), i + static_cast<size_t>(fit));
    const std::vector<size_t> batch(order.begin() + i, order.begin() + end);
    score_batch(model, requests, batch, options, out);
    done += static_cast<int64_t>(batch.size());
    if (progress) progress(done, total);
    i = end;
  }
  return out;
}

}  // namespace archspace
