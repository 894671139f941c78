#include "archspace/infer/score.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "archspace/infer/prefix_groups.h"
#include "archspace/model/kv_cache.h"
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
    if (q.run_length() > c.max_position_embeddings) {
      throw Error(which + std::to_string(q.run_length()) + " tokens to run exceed the model's context of " +
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

// What a request's rows of hidden states predict, in order: its scored tokens, then -1 for the next-token row
// (which predicts nothing; its whole distribution is kept).
void add_targets(const ScoreRequest& q, std::vector<int64_t>& targets) {
  for (size_t t = static_cast<size_t>(q.first_scored); t < q.ids.size(); ++t) targets.push_back(q.ids[t]);
  if (q.next_token) targets.push_back(-1);
}

// The head over rows of final hidden states [R, d] that predict `targets`, handed out in row order to `owners`
// (request indices; each owns the rows add_targets gives it, consecutively).
void score_rows(const CausalLM& model, const at::Tensor& hidden, const std::vector<int64_t>& targets,
                const std::vector<ScoreRequest>& requests, const std::vector<size_t>& owners,
                const ScoreOptions& options, std::vector<SequenceScore>& out) {
  std::vector<TokenLogprob> scored(targets.size());
  std::vector<at::Tensor> next_rows(targets.size());
  // The rows through the head, a chunk at a time (model/loss.h); the visitor reads what else of each chunk's
  // distribution is asked for.
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
  const at::Tensor picked =
      label_logprobs(hidden, model.head_weight(), at::tensor(targets, at::kLong), options.head_chunk, visit).cpu();
  const auto picked_a = picked.accessor<float, 1>();
  for (size_t row = 0; row < targets.size(); ++row)
    if (targets[row] >= 0) scored[row].logprob = picked_a[row];
  size_t row = 0;
  for (size_t r : owners) {
    const ScoreRequest& q = requests[r];
    SequenceScore& s = out[r];
    for (size_t t = static_cast<size_t>(q.first_scored); t < q.ids.size(); ++t)
      s.tokens.push_back(std::move(scored[row++]));
    if (q.next_token) s.next_logprobs = next_rows[row++];
  }
}

// Scores one batch of whole sequences (indices into `requests`), right-padded to the longest.
void score_whole(const CausalLM& model, const std::vector<ScoreRequest>& requests, const std::vector<size_t>& batch,
                 const ScoreOptions& options, std::vector<SequenceScore>& out) {
  const auto B = static_cast<int64_t>(batch.size());
  int64_t T = 1;
  for (size_t r : batch) T = std::max<int64_t>(T, requests[r].run_length());
  at::Tensor ids = at::zeros({B, T}, at::kLong);
  auto ids_a = ids.accessor<int64_t, 2>();
  std::vector<int64_t> rows, targets;  // flat hidden-state rows to put through the head, and their targets
  for (int64_t b = 0; b < B; ++b) {
    const ScoreRequest& q = requests[batch[b]];
    for (int64_t t = 0; t < q.run_length(); ++t) ids_a[b][t] = q.ids[t];
    // Row t - 1 predicts token t; the next-token row is the last one run.
    for (int64_t t = q.first_scored; t <= q.run_length(); ++t) rows.push_back(b * T + t - 1);
    add_targets(q, targets);
  }
  SequenceOptions fwd;
  fwd.final_hidden_only = true;
  const at::Tensor hidden = model.forward(ids.to(model.device()), fwd);
  const at::Tensor flat = hidden.reshape({B * T, hidden.size(-1)});
  score_rows(model, flat.index_select(0, at::tensor(rows, at::kLong).to(model.device())), targets, requests, batch,
             options, out);
}

// Scores one batch of prefix groups (infer/prefix_groups.h): the prefixes run once, left-padded into a KV cache
// (generate's batched prefill); the cache's rows are repeated for the members that run tokens of their own, which
// run right-padded over it. A member's first scored token is predicted by its prefix's last position.
void score_shared(const CausalLM& model, const std::vector<ScoreRequest>& requests,
                  const std::vector<PrefixGroup>& groups, const ScoreOptions& options,
                  std::vector<SequenceScore>& out) {
  const auto G = static_cast<int64_t>(groups.size());
  int64_t P = 0, S = 0;
  for (const PrefixGroup& g : groups) {
    P = std::max(P, g.prefix);
    S = std::max(S, g.longest_suffix);
  }
  std::vector<int64_t> padding(G);
  at::Tensor prefix_ids = at::zeros({G, P}, at::kLong);  // padding ids are masked out: any valid id
  auto prefix_a = prefix_ids.accessor<int64_t, 2>();
  for (int64_t g = 0; g < G; ++g) {
    const PrefixGroup& group = groups[g];
    padding[g] = P - group.prefix;
    const ScoreRequest& first = requests[group.members.front()];
    for (int64_t t = 0; t < group.prefix; ++t) prefix_a[g][padding[g] + t] = first.ids[t];
  }
  KVCache cache(model.config(), G > 1 ? padding : std::vector<int64_t>{});
  DecodeOptions fwd;
  fwd.cache = &cache;
  fwd.final_hidden_only = true;
  DecodeOptions last = fwd;
  last.last_position_only = true;
  const at::Tensor prefix_last = model.forward(prefix_ids.to(model.device()), last).squeeze(1);  // [G, d]

  // The members that run tokens of their own, each over its group's cache row.
  std::vector<int64_t> cache_rows;
  std::vector<size_t> runners;
  for (int64_t g = 0; g < G; ++g) {
    for (size_t i : groups[g].members) {
      if (requests[i].run_length() > groups[g].prefix) {
        cache_rows.push_back(g);
        runners.push_back(i);
      }
    }
  }
  const auto R = static_cast<int64_t>(runners.size());
  at::Tensor rows_hidden = prefix_last;
  if (R > 0) {
    cache.keep_rows(cache_rows);
    at::Tensor suffix_ids = at::zeros({R, S}, at::kLong);  // right padding: no real position sees it
    auto suffix_a = suffix_ids.accessor<int64_t, 2>();
    for (int64_t r = 0; r < R; ++r) {
      const ScoreRequest& q = requests[runners[r]];
      for (int64_t t = q.first_scored; t < q.run_length(); ++t) suffix_a[r][t - q.first_scored] = q.ids[t];
    }
    const at::Tensor suffix = model.forward(suffix_ids.to(model.device()), fwd);  // [R, S, d]
    rows_hidden = at::cat({prefix_last, suffix.reshape({R * S, suffix.size(-1)})});
  }
  // Each member's rows: its prefix's last position, then its own positions (row G + r S + t of rows_hidden).
  std::vector<int64_t> rows, targets;
  std::vector<size_t> owners;
  int64_t r = 0;
  for (int64_t g = 0; g < G; ++g) {
    for (size_t i : groups[g].members) {
      const ScoreRequest& q = requests[i];
      rows.push_back(g);
      const int64_t own = q.run_length() - q.first_scored;
      for (int64_t t = 0; t < own; ++t) rows.push_back(G + r * S + t);
      r += own > 0;
      add_targets(q, targets);
      owners.push_back(i);
    }
  }
  score_rows(model, rows_hidden.index_select(0, at::tensor(rows, at::kLong).to(model.device())), targets, requests,
             owners, options, out);
}

}  // namespace

std::vector<SequenceScore> score_sequences(const CausalLM& model, const std::vector<ScoreRequest>& requests,
                                           const ScoreOptions& options,
                                           const std::function<void(int64_t, int64_t)>& progress) {
  validate(model, requests, options);
  c10::InferenceMode guard;
  std::vector<SequenceScore> out(requests.size());
  const auto total = static_cast<int64_t>(requests.size());
  int64_t done = 0;
  auto report = [&](size_t scored) {
    done += static_cast<int64_t>(scored);
    if (progress) progress(done, total);
  };
  std::vector<size_t> whole(requests.size());
  std::iota(whole.begin(), whole.end(), 0);
  if (options.share_prefixes) {
    const PrefixPlan plan = plan_prefix_sharing(requests, options.max_batch_tokens, options.max_batch_sequences);
    for (const auto& batch : plan.batches) {
      score_shared(model, requests, batch, options, out);
      size_t members = 0;
      for (const PrefixGroup& g : batch) members += g.members.size();
      report(members);
    }
    whole = plan.alone;
  }
  // Longest first, so that a batch's padding is small and the memory peak comes first.
  std::stable_sort(whole.begin(), whole.end(),
                   [&](size_t a, size_t b) { return requests[a].ids.size() > requests[b].ids.size(); });
  for (size_t i = 0; i < whole.size();) {
    // Sorted descending, so the first sequence sets the padded length of the batch.
    const int64_t longest = std::max<int64_t>(1, requests[whole[i]].run_length());
    int64_t fit = std::max<int64_t>(1, options.max_batch_tokens / longest);
    if (options.max_batch_sequences > 0) fit = std::min(fit, options.max_batch_sequences);
    const size_t end = std::min(whole.size(), i + static_cast<size_t>(fit));
    const std::vector<size_t> batch(whole.begin() + i, whole.begin() + end);
    score_whole(model, requests, batch, options, out);
    report(batch.size());
    i = end;
  }
  return out;
}

}  // namespace archspace
